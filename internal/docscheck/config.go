package docscheck

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/BurntSushi/toml"
)

// commentedTOML matches a commented-out table header or key of an example
// file ("# [[user]]", "# weights = [1]    # ..."): optional parts of the
// example, shown but not in force. Prose comments do not match.
var commentedTOML = regexp.MustCompile(`^#\s?(\[\[?[a-z_.]+\]\]?\s*(#.*)?|[a-z][a-z0-9_]*\s*=\s*\S.*)$`)

// ExampleKeys returns the keys of a TOML example file as "table.key" (the
// form of bucketcfg.FileKeys), sorted and without repetition, counting
// the commented-out tables and keys too. Arrays of tables ([[bucket]])
// contribute the keys of all their entries.
func ExampleKeys(example string) ([]string, error) {
	lines := strings.Split(example, "\n")
	for i, l := range lines {
		if commentedTOML.MatchString(l) {
			lines[i] = strings.TrimPrefix(strings.TrimPrefix(l, "#"), " ")
		}
	}
	var doc map[string]any
	if _, err := toml.Decode(strings.Join(lines, "\n"), &doc); err != nil {
		return nil, fmt.Errorf("the example with its commented-out parts in: %w", err)
	}
	seen := map[string]bool{}
	walkKeys(doc, "", seen)
	keys := make([]string, 0, len(seen))
	for k := range seen {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys, nil
}

// walkKeys records in seen the keys of the decoded table t, prefixed.
func walkKeys(t map[string]any, prefix string, seen map[string]bool) {
	for k, v := range t {
		switch v := v.(type) {
		case map[string]any:
			walkKeys(v, prefix+k+".", seen)
		case []map[string]any:
			for _, e := range v {
				walkKeys(e, prefix+k+".", seen)
			}
		default:
			seen[prefix+k] = true
		}
	}
}

// Undocumented returns the keys of keys ("table.key") that the section of
// their table in the configuration document does not name as `key`, each
// with the reason.
func Undocumented(configDoc string, keys []string) []string {
	sections := TableSections(configDoc)
	var bad []string
	for _, full := range keys {
		i := strings.LastIndex(full, ".")
		if i < 0 {
			bad = append(bad, fmt.Sprintf("%s: a key outside any table", full))
			continue
		}
		table, key := full[:i], full[i+1:]
		body, ok := sections[table]
		switch {
		case !ok:
			bad = append(bad, fmt.Sprintf("%s: no heading for the table [%s]", full, table))
		case !strings.Contains(body, "`"+key+"`"):
			bad = append(bad, fmt.Sprintf("%s: `%s` is not named under the heading of [%s]", full, key, table))
		}
	}
	return bad
}
