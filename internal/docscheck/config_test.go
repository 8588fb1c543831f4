package docscheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// TestConfigKeysDocumented: every key the configuration model accepts
// (bucketcfg's TOML shape, read by reflection: a key added there without
// documentation fails here) and every key of config.example.toml, its
// commented-out tables and keys included, is named as `key` under the
// heading of its table in docs/configuration.md. The example shows every
// key the model accepts, and nothing else.
func TestConfigKeysDocumented(t *testing.T) {
	model := bucketcfg.FileKeys()
	if len(model) < 50 || !slices.Contains(model, "upstream.tls.enabled") || !slices.Contains(model, "bucket.name") {
		t.Fatalf("bucketcfg.FileKeys looks wrong (nested and array tables missing?): %v", model)
	}
	example, err := ExampleKeys(readRepo(t, "config.example.toml"))
	if err != nil {
		t.Fatalf("config.example.toml: %v", err)
	}
	for _, table := range []string{"proxy", "upstream.tls", "bucket", "user", "listener"} {
		if !slices.ContainsFunc(example, func(k string) bool { return strings.HasPrefix(k, table+".") }) {
			t.Errorf("config.example.toml: no key of [%s] found (the parser missed a table?)", table)
		}
	}
	doc := readRepo(t, "docs/configuration.md")
	for _, bad := range Undocumented(doc, model) {
		t.Errorf("docs/configuration.md: %s", bad)
	}
	for _, bad := range Undocumented(doc, example) {
		t.Errorf("docs/configuration.md (key of config.example.toml): %s", bad)
	}
	for _, k := range example {
		if !slices.Contains(model, k) {
			t.Errorf("config.example.toml shows %s, which the configuration model does not accept", k)
		}
	}
	for _, k := range model {
		if !slices.Contains(example, k) {
			t.Errorf("config.example.toml does not show %s (it shows every key, commented out where optional)", k)
		}
	}
}

// TestUndocumentedFindsGaps: the check itself sees a missing key, a key
// named under another table's heading, and a table without a heading.
func TestUndocumentedFindsGaps(t *testing.T) {
	doc := "# Configuration\n\n## `[proxy]`\n\n| `listen` | x |\n\n### `[proxy.tls]`\n\n| `enabled` | y |\n\n" +
		"## `[[bucket]]`\n\n```toml\n# not a heading\n```\n| `name` | z |\n"
	got := Undocumented(doc, []string{"proxy.listen", "proxy.enabled", "proxy.tls.enabled", "bucket.name", "bucket.weight", "fleet.name"})
	want := []string{"proxy.enabled", "bucket.weight", "fleet.name"}
	if len(got) != len(want) {
		t.Fatalf("Undocumented = %q, want problems with %q", got, want)
	}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w+":") {
			t.Errorf("problem %d = %q, want one about %s", i, got[i], w)
		}
	}
}

// TestExampleKeysReadsCommentedParts: commented-out tables and keys count,
// arrays of tables give every entry's keys, prose comments are ignored.
func TestExampleKeysReadsCommentedParts(t *testing.T) {
	example := `# An example. Privileges: "admin" (opcodes), see below.
[upstream]
servers = ["a:1"]   # the servers
# weights = [1]     # optional

[upstream.tls]
enabled = false

# Further addresses:
# [[listener]]
# listen = "10.0.0.1:1"

[[bucket]]
name = "a"
[[bucket]]
name = "b"
weight = 2
`
	got, err := ExampleKeys(example)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bucket.name", "bucket.weight", "listener.listen", "upstream.servers", "upstream.tls.enabled", "upstream.weights"}
	if !slices.Equal(got, want) {
		t.Errorf("ExampleKeys = %q, want %q", got, want)
	}
}
