package bucketcfg

import (
	"path/filepath"

	"github.com/kvthrottle/kvthrottle/internal/echo"
)

// The values of tls.client_cert_user: which field of a verified client
// certificate names the [[user]] the client is.
const (
	CertUserSubjectCN = "subject.cn" // the subject's common name
	CertUserSANDNS    = "san.dns"    // the DNS subject alternative name
	CertUserSANEmail  = "san.email"  // the e-mail subject alternative name
	CertUserSANURI    = "san.uri"    // the URI subject alternative name
)

// The values of tls.min_version.
const (
	TLSVersion12 = "1.2"
	TLSVersion13 = "1.3"
)

// TLSConfig is the [tls] table (DESIGN.md section 11): a listener for
// clients speaking TLS, beside proxy.listen. Paths are resolved like
// throttle.state_file: [Load] makes a relative one relative to the
// directory of the configuration file. The files themselves are read by
// the proxy (at start, and again at every reload); this package only
// checks the values.
type TLSConfig struct {
	// Listen is the TLS client address, host:port (key listen, default ""
	// meaning no TLS listener). An empty host means every interface; port 0
	// picks a free port. It may not be proxy.listen nor a [[listener]]'s.
	// Read at start; a reload must keep it.
	Listen string
	// CertFile is the server certificate chain, PEM (key cert_file,
	// default ""; required when Listen is set).
	CertFile string
	// KeyFile is the server certificate's private key, PEM (key key_file,
	// default ""; required when Listen is set).
	KeyFile string
	// ClientCAFile holds the PEM certificates of the CAs that sign client
	// certificates (key client_ca_file, default ""). Set, every TLS client
	// must present a certificate signed by one of them whose
	// ClientCertUser field names a [[user]]: the client is that user from
	// its first byte. "" means clients present no certificate and
	// authenticate as on proxy.listen.
	ClientCAFile string
	// ClientCertUser names the certificate field that names the user (key
	// client_cert_user, default "subject.cn"): one of CertUserSubjectCN,
	// CertUserSANDNS, CertUserSANEmail, CertUserSANURI. A certificate
	// whose field has more than one value (two CNs, two SANs of the kind)
	// names no single user and is refused.
	ClientCertUser string
	// MinVersion is the oldest TLS version accepted, TLSVersion12 or
	// TLSVersion13 (key min_version, default "1.2").
	MinVersion string
}

// tomlTLS is the TOML shape of [tls].
type tomlTLS struct {
	Listen         *string `toml:"listen"`
	CertFile       *string `toml:"cert_file"`
	KeyFile        *string `toml:"key_file"`
	ClientCAFile   *string `toml:"client_ca_file"`
	ClientCertUser *string `toml:"client_cert_user"`
	MinVersion     *string `toml:"min_version"`
}

func init() {
	for _, k := range []string{"tls", "tls.listen", "tls.cert_file", "tls.key_file",
		"tls.client_ca_file", "tls.client_cert_user", "tls.min_version"} {
		knownKeys[k] = true
	}
}

// buildTLS validates [tls]; cfg.Proxy and cfg.Listeners are already built.
func buildTLS(cfg *Config, raw *tomlTLS, probs *problems) {
	t := &cfg.TLS
	t.Listen = strOr(raw.Listen, "")
	t.CertFile = strOr(raw.CertFile, "")
	t.KeyFile = strOr(raw.KeyFile, "")
	t.ClientCAFile = strOr(raw.ClientCAFile, "")
	t.ClientCertUser = strOr(raw.ClientCertUser, CertUserSubjectCN)
	t.MinVersion = strOr(raw.MinVersion, TLSVersion12)
	switch t.ClientCertUser {
	case CertUserSubjectCN, CertUserSANDNS, CertUserSANEmail, CertUserSANURI:
	default:
		probs.addf("tls.client_cert_user", `must be "subject.cn", "san.dns", "san.email" or "san.uri", got %s`, echo.Quote(t.ClientCertUser))
	}
	if t.MinVersion != TLSVersion12 && t.MinVersion != TLSVersion13 {
		probs.addf("tls.min_version", `must be "1.2" or "1.3", got %s`, echo.Quote(t.MinVersion))
	}
	if t.Listen == "" {
		return
	}
	checkListen("tls.listen", t.Listen, probs)
	if t.Listen == cfg.Proxy.Listen || samePortAmbiguous(t.Listen, cfg.Proxy.Listen) {
		probs.addf("tls.listen", "%s is proxy.listen's address or port; give the TLS listener its own", echo.Quote(t.Listen))
	}
	for _, l := range cfg.Listeners {
		if t.Listen == l.Listen || samePortAmbiguous(t.Listen, l.Listen) {
			probs.addf("tls.listen", "%s is a [[listener]]'s address or port; give the TLS listener its own", echo.Quote(t.Listen))
		}
	}
	if t.CertFile == "" {
		probs.addf("tls.cert_file", "is required when tls.listen is set")
	}
	if t.KeyFile == "" {
		probs.addf("tls.key_file", "is required when tls.listen is set")
	}
}

// resolvePaths makes the relative file names of t relative to dir.
func (t *TLSConfig) resolvePaths(dir string) {
	resolveUnder(dir, &t.CertFile, &t.KeyFile, &t.ClientCAFile)
}

// resolveUnder makes each of the file names that is relative (and not
// empty) relative to dir: the configuration file's directory.
func resolveUnder(dir string, names ...*string) {
	for _, p := range names {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(dir, *p)
		}
	}
}
