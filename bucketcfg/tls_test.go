package bucketcfg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseTLS(t *testing.T) {
	cfg := mustParse(t, "")
	want := TLSConfig{ClientCertUser: "subject.cn", MinVersion: "1.2"}
	if cfg.TLS != want {
		t.Fatalf("defaults: %+v, want %+v", cfg.TLS, want)
	}
	cfg = mustParse(t, `
[tls]
listen = "127.0.0.1:11312"
cert_file = "/etc/kv/server.pem"
key_file = "/etc/kv/server.key"
client_ca_file = "/etc/kv/ca.pem"
client_cert_user = "san.email"
min_version = "1.3"
`)
	want = TLSConfig{Listen: "127.0.0.1:11312", CertFile: "/etc/kv/server.pem", KeyFile: "/etc/kv/server.key",
		ClientCAFile: "/etc/kv/ca.pem", ClientCertUser: "san.email", MinVersion: "1.3"}
	if cfg.TLS != want {
		t.Fatalf("got %+v, want %+v", cfg.TLS, want)
	}
	for _, f := range []string{"subject.cn", "san.dns", "san.uri"} {
		mustParse(t, "[tls]\nclient_cert_user = \""+f+"\"\n")
	}
}

func TestParseTLSRejects(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"unknown key", "[tls]\nlisten_addr = \"127.0.0.1:1\"\n", "tls.listen_addr: unknown key"},
		{"field", "[tls]\nclient_cert_user = \"cn\"\n", "tls.client_cert_user: must be"},
		{"version", "[tls]\nmin_version = \"1.1\"\n", "tls.min_version: must be \"1.2\" or \"1.3\""},
		{"listen", "[tls]\nlisten = \"nowhere\"\ncert_file = \"c\"\nkey_file = \"k\"\n", "tls.listen: must be host:port"},
		{"cert", "[tls]\nlisten = \"127.0.0.1:11312\"\nkey_file = \"k\"\n", "tls.cert_file: is required"},
		{"key", "[tls]\nlisten = \"127.0.0.1:11312\"\ncert_file = \"c\"\n", "tls.key_file: is required"},
		{"proxy.listen", "[proxy]\nlisten = \"127.0.0.1:11311\"\n[tls]\nlisten = \"127.0.0.1:11311\"\ncert_file = \"c\"\nkey_file = \"k\"\n", "tls.listen: \"127.0.0.1:11311\" is proxy.listen's"},
		{"proxy.listen port", "[proxy]\nlisten = \":11311\"\n[tls]\nlisten = \"127.0.0.1:11311\"\ncert_file = \"c\"\nkey_file = \"k\"\n", "is proxy.listen's address or port"},
		{"listener", "[[bucket]]\nname = \"default\"\n[[listener]]\nlisten = \"127.0.0.1:11400\"\nbucket = \"default\"\n[tls]\nlisten = \"127.0.0.1:11400\"\ncert_file = \"c\"\nkey_file = \"k\"\n", "is a [[listener]]'s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse([]byte(c.doc))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestLoadTLSRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.toml")
	doc := "[tls]\nlisten = \"127.0.0.1:11312\"\ncert_file = \"certs/s.pem\"\nkey_file = \"/abs/s.key\"\nclient_ca_file = \"ca.pem\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.TLS.CertFile != filepath.Join(dir, "certs/s.pem") || cfg.TLS.KeyFile != "/abs/s.key" || cfg.TLS.ClientCAFile != filepath.Join(dir, "ca.pem") {
		t.Fatalf("paths not resolved against the file's directory: %+v", cfg.TLS)
	}
}
