package rules

import (
	"iter"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// decoder decodes a file's node tree into a [Config] by the Config's types: a mapping key names
// a struct field as the field's yaml tag does (a key no tag names is an unknown field), and a
// value is read as its field's Go type says. The tags are the one definition of the field
// names; nothing here names a field.
//
// It walks the tree itself rather than through the YAML library's decoding. The library is
// strict only through yaml.Decoder's KnownFields(true), which decodes the text, not a tree: the
// tree kept to give a problem its line would be parsed a second time, and the JSON reader's
// tree (json.go) not decoded at all. Its errors name a line and a Go type, not the field path in
// rules-file spelling that every message here names. The rules file also reads a few values its
// own way: a duration is never a bare number, a match value is any scalar's text, a null is an
// omitted field, and nothing under coordination is quoted.
type decoder struct {
	problems
	quiet bool // within coordination: no value or unknown key is quoted, as any may be a password
}

// tagNames maps each struct type of a [Config] to the names its fields' yaml tags give, in field
// order (a test checks that the json tags agree), tagOffsets to the fields' offsets, and
// tagScalars to whether each field holds one value (a string, number, duration, time or bool)
// rather than a list, mapping or struct.
var tagNames, tagOffsets, tagScalars = structTags(configType)

var (
	configType       = reflect.TypeFor[Config]()
	coordinationType = reflect.TypeFor[Coordination]()
	guardType        = reflect.TypeFor[Guard]()
	durationType     = reflect.TypeFor[Duration]()
	timeType         = reflect.TypeFor[time.Time]()
	thresholdsType   = reflect.TypeFor[map[string]float64]() // Budget.ThrottleWhen
)

// structTags returns the tag names, the offsets and whether each holds one value (a scalar),
// of the fields of struct type t and of every struct type its fields hold.
func structTags(t reflect.Type) (map[reflect.Type][]string, map[reflect.Type][]uintptr, map[reflect.Type][]bool) {
	names, offsets, scalars := map[reflect.Type][]string{}, map[reflect.Type][]uintptr{}, map[reflect.Type][]bool{}
	var add func(t reflect.Type)
	add = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
			t = t.Elem()
		}
		if _, done := names[t]; done || t.Kind() != reflect.Struct || t == timeType {
			return
		}
		n := t.NumField()
		names[t], offsets[t], scalars[t] = make([]string, n), make([]uintptr, n), make([]bool, n)
		for i := range n {
			f := t.Field(i)
			names[t][i], _, _ = strings.Cut(f.Tag.Get("yaml"), ",")
			offsets[t][i] = f.Offset
			ft := f.Type
			for ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			switch ft.Kind() {
			case reflect.Slice, reflect.Map:
			case reflect.Struct: // a time, and a guard, whose short form is its mode, are one value
				scalars[t][i] = ft == timeType || ft == guardType
			default:
				scalars[t][i] = true
			}
			add(f.Type)
		}
	}
	add(t)
	return names, offsets, scalars
}

// value decodes n, the value written at at, into v, as v's type says.
func (d *decoder) value(n *yaml.Node, at field, v reflect.Value) {
	switch v.Type() {
	case durationType:
		v.SetInt(int64(d.duration(n, at)))
		return
	case timeType:
		v.Set(reflect.ValueOf(d.time(n, at)))
		return
	case guardType:
		v.Set(reflect.ValueOf(d.guard(n, at)))
		return
	case thresholdsType:
		v.Set(reflect.ValueOf(d.thresholds(n, at)))
		return
	case coordinationType:
		d.quiet = true
		d.mapping(n, at, v)
		d.quiet = false
		return
	}
	switch v.Kind() {
	case reflect.Pointer: // an optional value: set when written
		p := reflect.New(v.Type().Elem())
		d.value(n, at, p.Elem())
		v.Set(p)
	case reflect.Struct:
		d.mapping(n, at, v)
	case reflect.Slice:
		d.list(n, at, v)
	case reflect.Map:
		v.Set(reflect.ValueOf(d.stringMap(n, at)))
	case reflect.String:
		v.SetString(d.str(n, at))
	case reflect.Int:
		v.SetInt(int64(d.int(n, at)))
	case reflect.Float64:
		v.SetFloat(d.float(n, at))
	case reflect.Bool:
		v.SetBool(d.boolean(n, at))
	default:
		panic("rules: no decoding for a field of type " + v.Type().String())
	}
}

// mapping decodes a mapping into struct v, each key into the field its tag names.
func (d *decoder) mapping(n *yaml.Node, at field, v reflect.Value) {
	scalar := tagScalars[v.Type()]
	d.fields(n, at, tagNames[v.Type()], func(i int, _ string, at field, val *yaml.Node) {
		if isNull(val) {
			// A field of one value written with none (mode:, max_concurrent:) is far more
			// often a template's unset variable than a wish to omit it, which would turn an
			// enforce budget into a warn one, or a limit off, unseen. null omits it.
			if scalar[i] && val.Value == "" {
				d.addLine(val.Line, at, "no value (an unset template variable?): write one, or leave the field out")
			}
			return
		}
		d.value(val, at, v.Field(i))
	})
}

// list decodes a sequence into slice v.
func (d *decoder) list(n *yaml.Node, at field, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		d.expected(n, at, "a list")
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	k := 0
	for i, c := range n.Content {
		if c = d.resolve(c, at.index(i)); c != nil {
			d.value(c, at.index(i), s.Index(k))
			k++
		}
	}
	v.Set(s.Slice(0, k))
}

// fields iterates over a mapping's pairs: it checks that n is a mapping with scalar, distinct
// keys and calls fn for each pair, nulls included. known lists the fields of a struct's
// mapping: a key not in it is an unknown field, with or without a value, and fn gets the
// field's index in known (mapping omits a field whose value is null). A nil known is a map of
// free keys (match, throttle_when): fn gets every pair, for its decoder to reject a null, and an
// index of -1.
func (d *decoder) fields(n *yaml.Node, at field, known []string, fn func(i int, key string, at field, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.expected(n, at, "a mapping")
		return
	}
	var seen map[string]int // for large mappings; small ones are searched
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.resolve(n.Content[i], at), d.resolve(n.Content[i+1], at)
		if k == nil || v == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode || isNull(k) {
			d.addLine(k.Line, at, "keys must be strings, got %s", d.describe(k))
			continue
		}
		kf := at.key(k.Value)
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			d.addLine(k.Line, kf, "merge keys are not supported")
			continue
		}
		index := slices.Index(known, k.Value)
		if known != nil && index < 0 {
			d.unknown(k, at, kf, known)
			continue
		}
		if first, dup := firstKey(n, i, k, &seen); dup {
			d.addLine(k.Line, kf, "duplicate key (first on line %d)", first)
			continue
		}
		fn(index, k.Value, kf, v)
	}
}

// firstKey reports whether k, the key at n.Content[i] with aliases followed, is a duplicate of
// an earlier scalar key of mapping n, and the line of the first. Small mappings (a budget's
// fields) are searched; a large one (health_queries, a long match) gets the index *seen, built
// on first use, so that a mapping of any size costs time in proportion to its keys.
func firstKey(n *yaml.Node, i int, k *yaml.Node, seen *map[string]int) (line int, dup bool) {
	const small = 16 // pairs
	key := k.Value
	if len(n.Content) <= 2*small {
		for j := 0; j < i; j += 2 {
			if prev := follow(n.Content[j]); prev != nil && prev.Kind == yaml.ScalarNode && !isNull(prev) && prev.Value == key {
				return prev.Line, true
			}
		}
		return 0, false
	}
	if *seen == nil {
		*seen = make(map[string]int, len(n.Content)/2)
	}
	if line, dup = (*seen)[key]; dup {
		return line, true
	}
	(*seen)[key] = k.Line
	return 0, false
}

// unknown reports key k (at kf) of the mapping at at as an unknown field, suggesting the known
// field it may be a typo of. Within coordination a key that is no such typo is not named: it
// may be a password written where a field was meant.
func (d *decoder) unknown(k *yaml.Node, at, kf field, known []string) {
	s := suggest(k.Value, known)
	switch {
	case d.quiet && s == "":
		d.addLine(k.Line, at, "unknown field (its name is not shown: it may hold a password)")
	case s == "":
		d.addLine(k.Line, kf, "unknown field")
	default:
		d.addLine(k.Line, kf, "unknown field (did you mean %s?)", s)
	}
}

// resolve follows aliases.
func (d *decoder) resolve(n *yaml.Node, at field) *yaml.Node {
	if f := follow(n); f != nil || n == nil {
		return f
	}
	d.addLine(n.Line, at, "alias chain too long")
	return nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// nearFailures indexes the fields that decoding errors were reported at, so that a validation
// error next to one (a field left zero because it failed to decode, reported again as missing)
// can be dropped: a generated file may have a problem in every one of its budgets, and each
// validation error is looked up along its own path alone, never against every decoding error.
type nearFailures map[string]bool // a field path: true where an error was reported, false above one

// failedFields indexes the fields of errs and every field above them.
func failedFields(errs []*Error) nearFailures {
	failed := make(nearFailures, 2*len(errs))
	for _, e := range errs {
		failed[e.Field] = true
		for above := range parentPaths(e.Field) {
			if _, ok := failed[above]; !ok {
				failed[above] = false
			}
		}
	}
	return failed
}

// near reports whether a decoding error was reported at path, above it or below it.
func (failed nearFailures) near(path string) bool {
	if _, ok := failed[path]; ok {
		return true // at path, or below it
	}
	for above := range parentPaths(path) {
		if failed[above] {
			return true
		}
	}
	return false
}

// parentPaths yields the paths of the fields above the field at path, as [field.String]
// renders them: "" (the top), then each path up to a step's '.' or '['. A bracketed key is
// skipped whole, so that a '.' or '[' quoted in it is not taken for a step.
func parentPaths(path string) iter.Seq[string] {
	return func(yield func(string) bool) {
		if path == "" {
			return
		}
		if !yield("") {
			return
		}
		for i := 0; i < len(path); i++ {
			switch path[i] {
			case '.':
				if !yield(path[:i]) {
					return
				}
			case '[':
				if i > 0 && !yield(path[:i]) {
					return
				}
				rest := path[i+1:]
				if q, err := strconv.QuotedPrefix(rest); err == nil {
					rest = rest[len(q):]
				}
				if j := strings.IndexByte(rest, ']'); j >= 0 {
					i = len(path) - len(rest) + j
				}
			}
		}
	}
}

// expected reports that the value n at at is not what was expected, and describes n; within
// coordination it describes nothing (see [decoder.describe]).
func (d *decoder) expected(n *yaml.Node, at field, what string) {
	if d.quiet {
		d.addLine(n.Line, at, "expected %s", what)
		return
	}
	d.addLine(n.Line, at, "expected %s, got %s", what, d.describe(n))
}

// describe names a node's kind for a message, quoting a scalar as [quoteShort] does (rules-file
// text, never SQL or bound values), or within coordination, not at all.
func (d *decoder) describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch {
		case isNull(n):
			return "null"
		case d.quiet:
			return "a value (not shown: it may hold a password)"
		}
		return quoteShort(n.Value)
	}
	return "an unexpected node"
}

// guard decodes the short form (a mode) or the scoped form ({mode, match}).
func (d *decoder) guard(n *yaml.Node, at field) Guard {
	var g Guard
	switch n.Kind {
	case yaml.ScalarNode:
		g.Mode = Mode(d.str(n, at))
	case yaml.MappingNode:
		d.mapping(n, at, reflect.ValueOf(&g).Elem())
	default:
		d.expected(n, at, "a mode or a mapping {mode, match}")
	}
	return g
}

// str accepts any non-null scalar as its text: match: {port: 5432} means the tag value
// "5432", exactly as written.
func (d *decoder) str(n *yaml.Node, at field) string {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.expected(n, at, "a string")
		return ""
	}
	return n.Value
}

func (d *decoder) stringMap(n *yaml.Node, at field) map[string]string {
	m := map[string]string{}
	d.fields(n, at, nil, func(_ int, key string, at field, v *yaml.Node) { m[key] = d.str(v, at) })
	return m
}

func (d *decoder) int(n *yaml.Node, at field) int {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.expected(n, at, "an integer")
		return 0
	}
	if plainDecimal(n.Value, false) {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v
		}
	}
	var v int
	if n.Decode(&v) != nil {
		d.expected(n, at, "an integer")
	}
	return v
}

func (d *decoder) float(n *yaml.Node, at field) float64 {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		d.expected(n, at, "a number")
		return 0
	}
	v, ok := 0.0, false
	if plainDecimal(n.Value, true) {
		var err error
		v, err = strconv.ParseFloat(n.Value, 64)
		ok = err == nil
	}
	if !ok && n.Decode(&v) != nil {
		d.expected(n, at, "a number")
		return 0
	}
	if v == 0 && !zeroText(n.Value) {
		// A number too small for a float64 (1e-400) reads as 0, which for server_share closes
		// the budget: refused rather than taken for a limit nobody wrote.
		d.addLine(n.Line, at, "too small a number: it reads as 0 (write 0 if that is meant)")
	}
	return v
}

// zeroText reports whether s, a number's text, writes a zero: no digit but 0 before any
// exponent.
func zeroText(s string) bool {
	mantissa, _, _ := strings.Cut(strings.ToLower(s), "e")
	return !strings.ContainsAny(mantissa, "123456789")
}

// plainDecimal reports whether s is a number that strconv reads exactly as YAML does: an
// optional minus, digits without a leading zero, and with point, a fraction. Other forms (0x1f,
// 0o17, 010, 1_000, .inf, 1e3) are left to the YAML decoder; this only spares it the common case,
// which matters in a file of many budgets.
func plainDecimal(s string, point bool) bool {
	s = strings.TrimPrefix(s, "-")
	intPart, frac, hasPoint := strings.Cut(s, ".")
	if hasPoint && (!point || frac == "") || intPart == "" || len(intPart) > 1 && intPart[0] == '0' {
		return false
	}
	for _, part := range []string{intPart, frac} {
		for i := 0; i < len(part); i++ {
			if part[i] < '0' || part[i] > '9' {
				return false
			}
		}
	}
	return true
}

// boolean decodes true or false.
func (d *decoder) boolean(n *yaml.Node, at field) bool {
	var v bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&v) != nil {
		d.expected(n, at, "true or false")
	}
	return v
}

// duration reads a duration such as 250ms (see [Duration]).
func (d *decoder) duration(n *yaml.Node, at field) Duration {
	const what = "a duration such as 1s"
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.expected(n, at, what)
		return 0
	}
	v, err := parseDuration(n.Value)
	switch {
	case err != nil && d.quiet:
		d.expected(n, at, what)
	case err != nil:
		d.addLine(n.Line, at, "%v", err)
	}
	return v
}

// time reads an RFC 3339 time, such as 2026-12-02T10:00:00Z.
func (d *decoder) time(n *yaml.Node, at field) time.Time {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.expected(n, at, "an RFC 3339 time such as 2026-12-02T10:00:00Z")
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	switch {
	case err != nil:
		d.addLine(n.Line, at, "invalid time %s (write an RFC 3339 time such as 2026-12-02T10:00:00Z)", quoteShort(n.Value))
	case t.IsZero():
		// Go's zero time, which a Config written in code leaves for "no until": refused rather
		// than read as no until, which would keep in force a rule its author meant lapsed.
		d.addLine(n.Line, at, "time %s is the zero time, which means none (write a real time, such as 2026-12-02T10:00:00Z)",
			quoteShort(n.Value))
	}
	return t
}

// thresholds reads throttle_when: metric names to thresholds.
func (d *decoder) thresholds(n *yaml.Node, at field) map[string]float64 {
	m := map[string]float64{}
	d.fields(n, at, nil, func(_ int, key string, at field, v *yaml.Node) { m[key] = d.threshold(v, at, key) })
	return m
}

// threshold reads a throttle_when value: a number or, for metrics measured in seconds
// (replication_lag, custom), also a duration.
func (d *decoder) threshold(n *yaml.Node, at field, key string) float64 {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		return d.float(n, at)
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" &&
		(key == MetricReplicationLag || strings.HasPrefix(key, CustomMetricPrefix)) {
		v, err := parseDuration(n.Value)
		if err != nil {
			d.addLine(n.Line, at, "%v", err)
		}
		return seconds(v)
	}
	d.expected(n, at, "a number")
	return 0
}

// seconds converts d to seconds without the float rounding of time.Duration.Seconds for
// whole-second values, so "5s" reads as exactly 5.
func seconds(d Duration) float64 {
	sec, ns := int64(d)/1e9, int64(d)%1e9
	return float64(sec) + float64(ns)/1e9
}
