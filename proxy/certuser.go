package proxy

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"strconv"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// Certificate identities (DESIGN.md section 11): the field
// tls.client_cert_user names of a verified client certificate names the
// [[user]] the client is. A certificate names one user: a field with more
// than one value (two subject CNs, two DNS names ...) is refused at the
// handshake rather than read as one of them. Go's x509 keeps only the last
// CN of a subject in Subject.CommonName, so "/CN=nobody/CN=admin" would
// otherwise log in as admin.

// errNoCertUser: the client's certificate does not name a [[user]].
var errNoCertUser = errors.New("client certificate names no user")

// errCertManyUsers: the client's certificate names more than one user.
var errCertManyUsers = errors.New("client certificate names more than one user")

// oidCommonName is the X.520 commonName attribute (2.5.4.3).
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// certUserName returns the one value of the certificate's field (a
// tls.client_cert_user value) that names its user. It fails, wrapping
// errNoCertUser, when the field has no value, and, wrapping
// errCertManyUsers, when it has more than one.
func certUserName(c *x509.Certificate, field string) (string, error) {
	var vals []string
	switch field {
	case bucketcfg.CertUserSubjectCN:
		// Every CN attribute of the subject, in whichever RDN.
		for _, a := range c.Subject.Names {
			if a.Type.Equal(oidCommonName) {
				vals = append(vals, fmt.Sprint(a.Value))
			}
		}
	case bucketcfg.CertUserSANDNS:
		vals = c.DNSNames
	case bucketcfg.CertUserSANEmail:
		vals = c.EmailAddresses
	case bucketcfg.CertUserSANURI:
		for _, u := range c.URIs {
			vals = append(vals, u.String())
		}
	}
	switch {
	case len(vals) == 0 || len(vals) == 1 && vals[0] == "":
		return "", fmt.Errorf("%w: the certificate has no %s", errNoCertUser, field)
	case len(vals) > 1:
		return "", fmt.Errorf("%w: the certificate has %d values of %s", errCertManyUsers, len(vals), field)
	}
	return vals[0], nil
}

// certSubject is the certificate's subject for logs: every attribute as
// the certificate holds it (pkix.Name.String shows only the last of two
// CNs), in RFC 2253 form, Go-quoted with ASCII escapes so that no byte of
// it can forge or break a log line. It holds no secret: a subject is
// public.
func certSubject(c *x509.Certificate) string {
	var rdn pkix.RDNSequence
	s := c.Subject.String()
	if rest, err := asn1.Unmarshal(c.RawSubject, &rdn); err == nil && len(rest) == 0 {
		s = rdn.String()
	}
	return strconv.QuoteToASCII(s)
}
