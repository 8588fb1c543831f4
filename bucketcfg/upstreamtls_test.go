package bucketcfg

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseUpstreamTLS(t *testing.T) {
	cfg := mustParse(t, "")
	if cfg.Upstream.TLS != (UpstreamTLSConfig{}) {
		t.Fatalf("defaults: %+v, want all zero (TLS off)", cfg.Upstream.TLS)
	}
	cfg = mustParse(t, `
[upstream]
servers = ["mc1.example:11211"]
[upstream.tls]
enabled = true
ca_file = "/etc/kv/mc-ca.pem"
cert_file = "/etc/kv/client.pem"
key_file = "/etc/kv/client.key"
server_name = "memcached.internal"
`)
	want := UpstreamTLSConfig{Enabled: true, CAFile: "/etc/kv/mc-ca.pem", CertFile: "/etc/kv/client.pem",
		KeyFile: "/etc/kv/client.key", ServerName: "memcached.internal"}
	if cfg.Upstream.TLS != want {
		t.Fatalf("got %+v, want %+v", cfg.Upstream.TLS, want)
	}
	// Enabled alone: the system's roots and each server's host.
	cfg = mustParse(t, "[upstream.tls]\nenabled = true\n")
	if cfg.Upstream.TLS != (UpstreamTLSConfig{Enabled: true}) {
		t.Fatalf("enabled alone: %+v", cfg.Upstream.TLS)
	}
	mustParse(t, "[upstream.tls]\nenabled = true\nserver_name = \"10.0.0.7\"\n")
}

func TestParseUpstreamTLSRejects(t *testing.T) {
	cases := []struct{ name, doc, want string }{
		{"unknown key", "[upstream.tls]\nenable = true\n", "upstream.tls.enable: unknown key"},
		{"type", "[upstream.tls]\nenabled = \"yes\"\n", "enabled"},
		{"file without enabled", "[upstream.tls]\nca_file = \"ca.pem\"\n", "upstream.tls.ca_file: is set but upstream.tls.enabled is false"},
		{"name without enabled", "[upstream.tls]\nenabled = false\nserver_name = \"mc\"\n", "upstream.tls.server_name: is set but upstream.tls.enabled is false"},
		{"key without cert", "[upstream.tls]\nenabled = true\nkey_file = \"k\"\n", "upstream.tls.cert_file: is required when upstream.tls.key_file is set"},
		{"cert without key", "[upstream.tls]\nenabled = true\ncert_file = \"c\"\n", "upstream.tls.key_file: is required when upstream.tls.cert_file is set"},
		{"server name with port", "[upstream.tls]\nenabled = true\nserver_name = \"mc:11211\"\n", "upstream.tls.server_name: must be a DNS name or an IP address"},
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

func TestLoadUpstreamTLSRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "c.toml")
	doc := "[upstream.tls]\nenabled = true\nca_file = \"certs/ca.pem\"\ncert_file = \"/abs/c.pem\"\nkey_file = \"c.key\"\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	u := cfg.Upstream.TLS
	if u.CAFile != filepath.Join(dir, "certs/ca.pem") || u.CertFile != "/abs/c.pem" || u.KeyFile != filepath.Join(dir, "c.key") {
		t.Fatalf("paths not resolved against the file's directory: %+v", u)
	}
}
