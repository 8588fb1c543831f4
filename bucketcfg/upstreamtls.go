package bucketcfg

import (
	"net/netip"

	"github.com/kvthrottle/kvthrottle/internal/echo"
)

// UpstreamTLSConfig is the [upstream.tls] table (DESIGN.md section 11): TLS
// from the proxy to its memcached servers (memcached -Z). Paths are
// resolved like [tls]'s: [Load] makes a relative one relative to the
// directory of the configuration file. The files are read by the proxy (at
// start, and again at every reload: the files and ServerName of a reload
// apply to the connections opened after it); this package only checks the
// values.
//
// Verified by default: with Enabled, each server's certificate must chain
// to CAFile (the system's roots when "") and name ServerName (when "", the
// host part of the server's address: a DNS name, or an IP address, which
// must then be in the certificate's IP SANs).
type UpstreamTLSConfig struct {
	// Enabled turns TLS on for every upstream connection, the health
	// probes' included (key enabled, default false). A reload must keep it.
	Enabled bool
	// CAFile holds the PEM certificates of the CAs that sign the servers'
	// certificates (key ca_file, default "": the system's roots).
	CAFile string
	// CertFile is a client certificate chain, PEM, for servers that
	// require one (memcached -o ssl_verify_mode=2, ssl_ca_cert=...) (key
	// cert_file, default "": none). Set with KeyFile or not at all.
	CertFile string
	// KeyFile is the client certificate's private key, PEM (key key_file,
	// default ""). Set with CertFile or not at all.
	KeyFile string
	// ServerName is the name every server's certificate must carry (key
	// server_name, default "": each server's own host, as written in
	// upstream.servers). A DNS name or an IP address, without a port.
	ServerName string
}

// tomlUpstreamTLS is the TOML shape of [upstream.tls].
type tomlUpstreamTLS struct {
	Enabled    *bool   `toml:"enabled"`
	CAFile     *string `toml:"ca_file"`
	CertFile   *string `toml:"cert_file"`
	KeyFile    *string `toml:"key_file"`
	ServerName *string `toml:"server_name"`
}

func init() {
	for _, k := range []string{"upstream.tls", "upstream.tls.enabled", "upstream.tls.ca_file",
		"upstream.tls.cert_file", "upstream.tls.key_file", "upstream.tls.server_name"} {
		knownKeys[k] = true
	}
}

// buildUpstreamTLS validates [upstream.tls].
func buildUpstreamTLS(t *UpstreamTLSConfig, raw *tomlUpstreamTLS, probs *problems) {
	t.Enabled = raw.Enabled != nil && *raw.Enabled
	t.CAFile = strOr(raw.CAFile, "")
	t.CertFile = strOr(raw.CertFile, "")
	t.KeyFile = strOr(raw.KeyFile, "")
	t.ServerName = strOr(raw.ServerName, "")
	if !t.Enabled {
		// A file named while TLS is off is most likely a TLS setup that
		// forgot enabled = true: say so rather than run in plaintext.
		for _, f := range []struct{ key, v string }{
			{"upstream.tls.ca_file", t.CAFile}, {"upstream.tls.cert_file", t.CertFile},
			{"upstream.tls.key_file", t.KeyFile}, {"upstream.tls.server_name", t.ServerName},
		} {
			if f.v != "" {
				probs.addf(f.key, "is set but upstream.tls.enabled is false; set enabled = true to use TLS, or remove it")
			}
		}
		return
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		if t.CertFile == "" {
			probs.addf("upstream.tls.cert_file", "is required when upstream.tls.key_file is set")
		} else {
			probs.addf("upstream.tls.key_file", "is required when upstream.tls.cert_file is set")
		}
	}
	if t.ServerName != "" {
		if _, err := netip.ParseAddr(t.ServerName); err != nil && !isDNSName(t.ServerName) {
			probs.addf("upstream.tls.server_name", "must be a DNS name or an IP address (no port), got %s", echo.Quote(t.ServerName))
		}
	}
}

// resolvePaths makes the relative file names of t relative to dir.
func (t *UpstreamTLSConfig) resolvePaths(dir string) {
	resolveUnder(dir, &t.CAFile, &t.CertFile, &t.KeyFile)
}
