package bucketcfg

import (
	"reflect"
	"sort"
	"strings"
)

// FileKeys returns every key the configuration file accepts, as
// "table.key" ("upstream.tls.enabled" for a key of a nested table,
// "bucket.name" for a key of the [[bucket]] array of tables), sorted. It
// is read from the TOML shape [Parse] decodes, so a key added to the model
// appears here without further work (the documentation check in
// internal/docscheck relies on that).
func FileKeys() []string {
	var keys []string
	collectKeys(reflect.TypeOf(tomlFile{}), "", &keys)
	sort.Strings(keys)
	return keys
}

// collectKeys appends the keys of the struct type t, prefixed with prefix,
// to keys: a field of struct type (or slice of struct, an array of tables)
// is a table whose keys are collected in turn; any other field is a key.
func collectKeys(t reflect.Type, prefix string, keys *[]string) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Struct {
			collectKeys(ft, prefix+name+".", keys)
			continue
		}
		*keys = append(*keys, prefix+name)
	}
}
