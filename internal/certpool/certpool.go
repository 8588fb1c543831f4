// Package certpool loads the certificate authorities a TLS configuration
// trusts (a client CA file, an upstream's or the fleet store's CA file):
// one place that reads a PEM file into an x509.CertPool.
package certpool

import (
	"crypto/x509"
	"fmt"
	"os"
)

// Load returns a pool of the certificates in the PEM file at path. It
// fails when the file cannot be read or holds no PEM certificate; the
// caller wraps the error with the setting that named the file.
func Load(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificate in it", path)
	}
	return pool, nil
}
