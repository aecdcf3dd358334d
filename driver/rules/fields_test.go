package rules

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

// everyFieldCoordination completes testdata/full.yaml, which writes every other field.
const everyFieldCoordination = `
coordination:
  redis: redis://127.0.0.1:6379/0
  sync_interval: 2s
  fallback_instances: 3
`

// TestEveryFieldIsDecoded: the field names are defined once, by the yaml struct tags; the
// decoder reads every one of them into its field. A field of a type the decoder cannot read, or
// that it leaves zero, fails this test.
func TestEveryFieldIsDecoded(t *testing.T) {
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(full), "    explain: call\n", "    explain: call\n    shared: false\n", 1) + everyFieldCoordination
	root, err := yamlTree([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	// Decoded without defaults, so that a field the file leaves out stays zero.
	d := decoder{problems: problems{root: root}}
	var cfg Config
	d.value(root, field{}, reflect.ValueOf(&cfg).Elem())
	if err := d.err(); err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{} // "Type.Field" written in at least one value
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Pointer:
			if !v.IsNil() {
				walk(v.Elem())
			}
		case reflect.Slice:
			for i := range v.Len() {
				walk(v.Index(i))
			}
		case reflect.Struct:
			for i := range v.NumField() {
				name := v.Type().Name() + "." + v.Type().Field(i).Name
				set[name] = set[name] || !v.Field(i).IsZero()
				walk(v.Field(i))
			}
		}
	}
	walk(reflect.ValueOf(&cfg))
	for _, s := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[Budget](), reflect.TypeFor[Rule](),
		reflect.TypeFor[Guards](), reflect.TypeFor[Guard](), reflect.TypeFor[Coordination](), reflect.TypeFor[Quarantine]()} {
		for i := range s.NumField() {
			if name := s.Name() + "." + s.Field(i).Name; !set[name] {
				t.Errorf("%s (%s) is never decoded", name, s.Field(i).Tag.Get("yaml"))
			}
		}
	}
}

// The yaml and json tags of every field agree: a file reads the same either way.
func TestTagsAgree(t *testing.T) {
	for _, s := range []reflect.Type{reflect.TypeFor[Config](), reflect.TypeFor[Budget](), reflect.TypeFor[Rule](),
		reflect.TypeFor[Guards](), reflect.TypeFor[Guard](), reflect.TypeFor[Coordination](), reflect.TypeFor[Quarantine]()} {
		for i := range s.NumField() {
			f := s.Field(i)
			// encoding/json omits a zero struct (a time) only with omitzero, which the YAML
			// library does not know; its omitempty omits one.
			y, j := f.Tag.Get("yaml"), strings.Replace(f.Tag.Get("json"), ",omitzero", ",omitempty", 1)
			if y == "" || y != j {
				t.Errorf("%s.%s: yaml tag %q, json tag %q", s.Name(), f.Name, y, j)
			}
		}
	}
}
