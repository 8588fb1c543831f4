package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/kvthrottle/kvthrottle/internal/certpool"
)

// The redis_url parameters of a TLS store (rediss://), taken out of the URL
// before go-redis parses it (it refuses parameters it does not know).
const (
	paramCAFile   = "tls_ca_file"   // PEM CAs the store's certificate must chain to (default: the system's roots)
	paramCertFile = "tls_cert_file" // PEM client certificate (Redis's tls-auth-clients)
	paramKeyFile  = "tls_key_file"  // its key
)

// storeTLS is what a redis_url says about TLS beyond go-redis's own
// parameters: the files named by its tls_* parameters, absolute paths.
type storeTLS struct {
	caFile, certFile, keyFile string
}

// splitTLSParams returns u without its tls_* parameters, and those. They
// are allowed with rediss:// only, must be absolute paths, and a client
// certificate needs its key and the other way round.
func splitTLSParams(u *url.URL) (*url.URL, storeTLS, error) {
	q := u.Query()
	st := storeTLS{caFile: q.Get(paramCAFile), certFile: q.Get(paramCertFile), keyFile: q.Get(paramKeyFile)}
	if st == (storeTLS{}) {
		return u, st, nil
	}
	if u.Scheme != "rediss" {
		return nil, st, fmt.Errorf("fleet: redis_url: %s, %s and %s need rediss:// (TLS)", paramCAFile, paramCertFile, paramKeyFile)
	}
	for name, path := range map[string]string{paramCAFile: st.caFile, paramCertFile: st.certFile, paramKeyFile: st.keyFile} {
		if path != "" && !filepath.IsAbs(path) {
			return nil, st, fmt.Errorf("fleet: redis_url: %s %q is not an absolute path", name, path)
		}
	}
	if (st.certFile == "") != (st.keyFile == "") {
		return nil, st, fmt.Errorf("fleet: redis_url: %s and %s go together", paramCertFile, paramKeyFile)
	}
	q.Del(paramCAFile)
	q.Del(paramCertFile)
	q.Del(paramKeyFile)
	out := *u
	out.RawQuery = q.Encode()
	return &out, st, nil
}

// apply loads the files into cfg (go-redis's TLS configuration of a
// rediss:// URL: the server's name set, verification on). A CA file
// replaces the system's roots; it must hold at least one certificate.
func (st storeTLS) apply(cfg *tls.Config) error {
	if cfg == nil {
		return nil
	}
	if st.caFile != "" {
		pool, err := certpool.Load(st.caFile)
		if err != nil {
			return fmt.Errorf("fleet: redis_url %s: %w", paramCAFile, err)
		}
		cfg.RootCAs = pool
	}
	if st.certFile != "" {
		cert, err := tls.LoadX509KeyPair(st.certFile, st.keyFile)
		if err != nil {
			return fmt.Errorf("fleet: redis_url %s and %s: %w", paramCertFile, paramKeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// explainTLS adds to a failed TLS handshake with the store what to check:
// the store's certificate did not verify, or the store asked for a client
// certificate this instance does not have. Other errors, and errors it
// has explained already (a dial's, returned again by a load), are
// returned as they are.
func explainTLS(err error) error {
	var done *tlsExplained
	if errors.As(err, &done) {
		return err
	}
	if hint := tlsHint(err); hint != "" {
		return &tlsExplained{err: err, hint: hint}
	}
	return err
}

// tlsExplained is an error with explainTLS's hint.
type tlsExplained struct {
	err  error
	hint string
}

func (e *tlsExplained) Error() string { return e.err.Error() + " (" + e.hint + ")" }
func (e *tlsExplained) Unwrap() error { return e.err }

// tlsHint is what to check for a failed TLS handshake with the store, or
// "".
func tlsHint(err error) string {
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	switch {
	case errors.As(err, &unknown):
		return "the store's certificate is not signed by a CA of redis_url's " + paramCAFile + ", or of the system's roots when it names none"
	case errors.As(err, &host):
		return "the store's certificate does not name the host of redis_url"
	case errors.As(err, &verify):
		return "the store's certificate was refused"
	}
	// The alert a server sends when it wants a client certificate
	// (TLS 1.3 sends it after the handshake: the first read fails).
	if msg := err.Error(); strings.Contains(msg, "tls: certificate required") || strings.Contains(msg, "tls: bad certificate") {
		return "the store wants a client certificate: redis_url's " + paramCertFile + " and " + paramKeyFile
	}
	return ""
}
