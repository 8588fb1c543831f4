package proxy

import (
	"crypto/tls"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvthrottle/kvthrottle/internal/mcclient"
	"github.com/kvthrottle/kvthrottle/internal/testcerts"
	mc "github.com/kvthrottle/kvthrottle/proto/binary"
)

// certUsersTail has, for each tls.client_cert_user field, two users a
// value of that field can name: an admin and a tenant of bucket alice.
func certUsersTail(t *testing.T) string {
	h := hashes(t)
	tail := "[[bucket]]\nname = \"default\"\n[[bucket]]\nname = \"alice\"\n"
	for _, name := range []string{"admin", "nobody", "admin.test", "nobody.test",
		"admin@example.test", "nobody@example.test", "spiffe://test/admin", "spiffe://test/nobody"} {
		priv, buckets := `[]`, `["alice"]`
		if strings.HasPrefix(name, "admin") || strings.HasSuffix(name, "/admin") {
			priv, buckets = `["admin"]`, `["*"]`
		}
		tail += fmt.Sprintf("[[user]]\nname = %q\npassword_hash = %q\nbuckets = %s\nprivileges = %s\n",
			name, h["alice"], buckets, priv)
	}
	return tail
}

// TestTLSCertNamesOneUser: a client certificate signed by the client CA
// whose tls.client_cert_user field holds two values, each naming a user
// (/CN=nobody/CN=admin, which Go's x509 reads as CN admin; two DNS names,
// e-mail addresses or URIs) is refused at the handshake and logged with
// its whole subject, quoted; no session opens. A certificate with one
// value of the field still logs in as that user (the general stats of a
// tenant name it).
func TestTLSCertNamesOneUser(t *testing.T) {
	t.Parallel()
	cases := []struct {
		field     string
		two, one  testcerts.Leaf
		oneUser   string
		logSubstr string
	}{
		{"subject.cn", testcerts.Leaf{CN: "nobody", MoreCNs: []string{"admin"}},
			testcerts.Leaf{CN: "nobody"}, "nobody", `"CN=admin,CN=nobody"`},
		{"san.dns", testcerts.Leaf{CN: "x", DNS: []string{"nobody.test", "admin.test"}},
			testcerts.Leaf{CN: "x", DNS: []string{"nobody.test"}}, "nobody.test", `"CN=x"`},
		{"san.email", testcerts.Leaf{CN: "x", Emails: []string{"admin@example.test", "nobody@example.test"}},
			testcerts.Leaf{CN: "x", Emails: []string{"nobody@example.test"}}, "nobody@example.test", `"CN=x"`},
		{"san.uri", testcerts.Leaf{CN: "x", URIs: []string{"spiffe://test/admin", "spiffe://test/nobody"}},
			testcerts.Leaf{CN: "x", URIs: []string{"spiffe://test/nobody"}}, "spiffe://test/nobody", `"CN=x"`},
	}
	for _, x := range cases {
		t.Run(x.field, func(t *testing.T) {
			var log lockedBuffer
			s := startTLSProxyWith(t, true, testConfig{proxy: `default_bucket = ""`, tail: certUsersTail(t), log: &log},
				fmt.Sprintf("client_cert_user = %q", x.field))
			x.two.Client, x.one.Client = true, true
			two := s.ca.Issue(t, x.two).TLS(t)
			before := s.p.tls.failures.Load()
			if err := certServed(t, s, &two); err == nil {
				t.Fatalf("a certificate with two %s values was served", x.field)
			}
			eventually(t, time.Minute, "the refusal counted", func() bool { return s.p.tls.failures.Load() == before+1 })
			eventually(t, time.Minute, "the refusal logged", func() bool {
				return strings.Contains(log.String(), "more than one user")
			})
			line := logLine(log.String(), "more than one user")
			if !strings.Contains(line, `"subject":`+jsonQuoted(x.logSubstr)) || !strings.Contains(line, `"level":"warn"`) {
				t.Errorf("refusal logged as %s, want the subject %s at warn", line, x.logSubstr)
			}
			if n := s.p.Connections(); n != 0 {
				t.Fatalf("%d sessions opened", n)
			}
			one := s.ca.Issue(t, x.one).TLS(t)
			c := s.client(t, &one)
			kv, err := c.Stats("")
			if err != nil || statValue(kv, "user") != x.oneUser {
				t.Fatalf("one-valued certificate: %v, stats %q, want user %s", err, kv, x.oneUser)
			}
		})
	}
}

// certServed dials the TLS listener with cert and sends a VERSION: nil
// when the proxy answered it. With TLS 1.3 the client's handshake ends
// before the server has checked its certificate, so a refusal may come
// as an alert on the first read.
func certServed(t *testing.T, s *tlsSetup, cert *tls.Certificate) error {
	c, err := s.dialTLS(t, cert)
	if err != nil {
		return err
	}
	_, err = mcclient.New(c).Do(mcclient.Request{Opcode: mc.OpVersion})
	return err
}

// logLine returns the first line of log holding s.
func logLine(log, s string) string {
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}

// jsonQuoted is s as a JSON string literal's content (quotes escaped),
// with its quotes.
func jsonQuoted(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"`
}
