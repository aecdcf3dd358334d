package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Parse parses a rules file, YAML or JSON, validates it and returns it with defaults filled
// in ([Config.WithDefaults]).
//
// Decoding is strict and every problem names its line and field (see [Error]); all problems
// found are returned, joined. A file must hold exactly one document; an empty file (or one
// with only comments) is an error, so that a file caught half-written during a reload is not
// taken for "no rules" — write {} for that. YAML anchors and aliases are followed; merge
// keys (<<) are not supported.
func Parse(data []byte) (cfg *Config, err error) {
	// A rules file is reloaded while the application runs: a parser bug on a bad file must
	// come back as an error, never take the process down.
	defer func() {
		if r := recover(); r != nil {
			cfg, err = nil, &Error{Line: 1, Msg: "cannot parse the file (an internal error: please report it)"}
		}
	}()
	root, ok := jsonTree(data)
	if !ok {
		if root, err = yamlTree(data); err != nil {
			return nil, err
		}
	}
	return decode(root)
}

// decode builds a Config from a file's root node, checks it and fills in its defaults.
func decode(root *yaml.Node) (*Config, error) {
	var d decoder
	cfg := &Config{}
	root = d.resolve(root, "")
	if root == nil || isNull(root) {
		line := 1
		if root != nil {
			line = max(root.Line, 1)
		}
		return nil, &Error{Line: line, Msg: "the file is empty (write {} for no rules)"}
	}
	if msg := notRulesDocument(root); msg != "" {
		return nil, &Error{Line: max(root.Line, 1), Msg: msg}
	}
	d.root = root
	d.config(root, cfg)
	v := problems{root: root}
	cfg.validate(&v)
	for _, e := range v.errs {
		// A field that failed to decode is left zero; do not report it again as missing.
		if !d.failedNear(e.Field) {
			d.errs = append(d.errs, e)
		}
	}
	if err := d.err(); err != nil {
		return nil, err
	}
	cfg.fillDefaults() // cfg is ours alone: no copy needed
	return cfg, nil
}

// yamlTree parses a file of one YAML document and returns the document's root node.
func yamlTree(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Line: 1, Msg: "the file is empty (write {} for no rules)"}
		}
		return nil, syntaxError(data, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, syntaxError(data, err)
		}
		return nil, &Error{Line: next.Line, Msg: "a second YAML document: the file must hold one"}
	}
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		return doc.Content[0], nil
	}
	return &doc, nil
}

// notRulesDocument returns why root cannot be a rules file, or "": its top level is not a
// mapping, or none of its keys is a field of a [Config] or close to one. Such a file (a
// password file, a .env file, a file of another program) is named as not a rules file rather
// than reported key by key, so that none of its content reaches an error or a log.
func notRulesDocument(root *yaml.Node) string {
	const msg = "not a rules file: %s, not a mapping of fields such as budgets and rules (its content is not shown)"
	switch root.Kind {
	case yaml.MappingNode:
	case yaml.SequenceNode:
		return fmt.Sprintf(msg, "the file is a list")
	default:
		return fmt.Sprintf(msg, "the file is a single value")
	}
	for i := 0; i < len(root.Content); i += 2 {
		k := follow(root.Content[i])
		if k == nil || k.Kind != yaml.ScalarNode {
			continue
		}
		if slices.Contains(configFields, k.Value) || suggest(k.Value, configFields) != "" {
			return ""
		}
	}
	if len(root.Content) == 0 {
		return "" // {}: no rules, written on purpose
	}
	return "not a rules file: none of its top-level keys is a field such as budgets or rules (its content is not shown)"
}

// decoder walks a YAML node tree into a Config. It does the walking itself rather than
// through yaml.Node.Decode because custom decoding would lose the decoder's KnownFields
// strictness, and because it records where each field is, for the checks that follow.
type decoder struct {
	problems
	quiet bool // within coordination: no value or unknown key is quoted, as any may be a password
}

// failedNear reports whether a decoding error was reported at field, above it or below it.
func (d *decoder) failedNear(field string) bool {
	for _, e := range d.errs {
		if related(e.Field, field) || related(field, e.Field) {
			return true
		}
	}
	return false
}

// related reports whether path b is a or lies under it.
func related(a, b string) bool {
	if a == "" || a == b {
		return true
	}
	rest, ok := strings.CutPrefix(b, a)
	return ok && (rest[0] == '.' || rest[0] == '[')
}

// resolve follows aliases.
func (d *decoder) resolve(n *yaml.Node, path string) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 8 {
			d.addLine(n.Line, path, "alias chain too long")
			return nil
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// fields iterates over a mapping's pairs: it checks that n is a mapping with scalar, distinct
// keys and calls fn for each pair. known lists the fields of a struct's mapping: a key not in
// it is an unknown field, with or without a value, and a known field with a null value is
// omitted (fn is not called). A nil known is a map of free keys (match, throttle_when): fn gets
// every pair, nulls included, for its decoder to reject.
func (d *decoder) fields(n *yaml.Node, path string, known []string, fn func(key string, keyPath string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mapping, got %s", d.describe(n))
		return
	}
	var seen map[string]int // for large mappings; small ones are searched
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.resolve(n.Content[i], path), d.resolve(n.Content[i+1], path)
		if k == nil || v == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode || isNull(k) {
			d.addLine(k.Line, path, "keys must be strings, got %s", d.describe(k))
			continue
		}
		kp := keyPath(path, k.Value)
		if path == "" {
			kp = strings.TrimPrefix(kp, ".")
		}
		if k.Value == "<<" && k.ShortTag() == "!!merge" {
			d.addLine(k.Line, kp, "merge keys are not supported")
			continue
		}
		if known != nil && !slices.Contains(known, k.Value) {
			d.unknown(k, path, kp, known)
			continue
		}
		if first, dup := firstKey(n, i, k, &seen); dup {
			d.addLine(k.Line, kp, "duplicate key (first on line %d)", first)
			continue
		}
		if known != nil && isNull(v) {
			continue
		}
		fn(k.Value, kp, v)
	}
}

// firstKey reports whether k, the key at n.Content[i] with aliases followed, is a duplicate of
// an earlier scalar key of mapping n, and the line of the first. Small mappings (a budget's fields) are searched; a large
// one (health_queries, a long match) gets the index *seen, built on first use, so that a
// mapping of any size costs time in proportion to its keys.
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

// items iterates over a sequence.
func (d *decoder) items(n *yaml.Node, path string, fn func(path string, v *yaml.Node)) {
	if n.Kind != yaml.SequenceNode {
		d.addLine(n.Line, path, "expected a list, got %s", d.describe(n))
		return
	}
	for i, c := range n.Content {
		p := indexPath(path, i)
		c = d.resolve(c, p)
		if c == nil {
			continue
		}
		fn(p, c)
	}
}

// unknown reports key k (at kp) of the mapping at path as an unknown field, suggesting the known field
// it may be a typo of. Within coordination a key that is no such typo is not named: it may be
// a password written where a field was meant.
func (d *decoder) unknown(k *yaml.Node, path, kp string, known []string) {
	s := suggest(k.Value, known)
	if d.quiet && s == "" {
		d.addLine(k.Line, path, "unknown field (its name is not shown: it may hold a password)")
		return
	}
	if s == "" {
		d.addLine(k.Line, kp, "unknown field")
		return
	}
	d.addLine(k.Line, kp, "unknown field (did you mean %s?)", s)
}

// The fields of each part of a file, from the yaml struct tags: the one definition of their
// names (a test checks that the decoder below reads every one).
var (
	configFields       = fieldNames[Config]()
	budgetFields       = fieldNames[Budget]()
	ruleFields         = fieldNames[Rule]()
	guardsFields       = fieldNames[Guards]()
	guardFields        = fieldNames[Guard]()
	coordinationFields = fieldNames[Coordination]()
	quarantineFields   = fieldNames[Quarantine]()
)

// fieldNames returns the names the yaml tags of struct T give its fields.
func fieldNames[T any]() []string {
	t := reflect.TypeFor[T]()
	names := make([]string, 0, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		names = append(names, name)
	}
	return names
}

func (d *decoder) config(n *yaml.Node, c *Config) {
	d.fields(n, "", configFields, func(key, path string, v *yaml.Node) {
		switch key {
		case "server_cores":
			c.ServerCores = d.float(v, path)
		case "health_interval":
			c.HealthInterval = d.duration(v, path)
		case "health_queries":
			c.HealthQueries = d.stringMap(v, path)
		case "budgets":
			c.Budgets = make([]Budget, 0, len(v.Content))
			d.items(v, path, func(p string, v *yaml.Node) {
				var b Budget
				d.budget(v, p, &b)
				c.Budgets = append(c.Budgets, b)
			})
		case "rules":
			c.Rules = make([]Rule, 0, len(v.Content))
			d.items(v, path, func(p string, v *yaml.Node) {
				var r Rule
				d.fields(v, p, ruleFields, func(key, path string, v *yaml.Node) {
					switch key {
					case "budget":
						r.Budget = d.str(v, path)
					case "match":
						r.Match = d.stringMap(v, path)
					case "until":
						r.Until = d.time(v, path)
					}
				})
				c.Rules = append(c.Rules, r)
			})
		case "guards":
			d.fields(v, path, guardsFields, func(key, path string, v *yaml.Node) {
				switch key {
				case "require_where":
					c.Guards.RequireWhere = d.guard(v, path)
				case "block_truncate":
					c.Guards.BlockTruncate = d.guard(v, path)
				}
			})
		case "coordination":
			c.Coordination = d.coordination(v, path)
		}
	})
}

func (d *decoder) budget(n *yaml.Node, path string, b *Budget) {
	d.fields(n, path, budgetFields, func(key, path string, v *yaml.Node) {
		switch key {
		case "name":
			b.Name = d.str(v, path)
		case "mode":
			b.Mode = Mode(d.str(v, path))
		case "max_concurrent":
			b.MaxConcurrent = new(d.int(v, path))
		case "per_query_limit":
			b.PerQueryLimit = d.duration(v, path)
		case "server_share":
			b.ServerShare = new(d.float(v, path))
		case "burst_limit":
			b.BurstLimit = d.duration(v, path)
		case "warning_threshold":
			b.WarningThreshold = d.float(v, path)
		case "per":
			b.Per = d.str(v, path)
		case "max_wait":
			b.MaxWait = d.duration(v, path)
		case "max_queue":
			b.MaxQueue = new(d.int(v, path))
		case "throttle_when":
			b.ThrottleWhen = map[string]float64{}
			d.fields(v, path, nil, func(key, path string, v *yaml.Node) {
				b.ThrottleWhen[key] = d.threshold(v, path, key)
			})
		case "explain":
			b.Explain = d.str(v, path)
		case "shared":
			b.Shared = d.boolean(v, path)
		case "max_duration":
			b.MaxDuration = d.duration(v, path)
		case "quarantine":
			q := &Quarantine{}
			d.fields(v, path, quarantineFields, func(key, path string, v *yaml.Node) {
				switch key {
				case "after":
					q.After = d.int(v, path)
				case "for":
					q.For = d.duration(v, path)
				}
			})
			b.Quarantine = q
		}
	})
}

// time reads an RFC 3339 time, such as 2026-12-02T10:00:00Z.
func (d *decoder) time(n *yaml.Node, path string) time.Time {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.addLine(n.Line, path, "expected an RFC 3339 time such as 2026-12-02T10:00:00Z, got %s", d.describe(n))
		return time.Time{}
	}
	t, err := time.Parse(time.RFC3339, n.Value)
	if err != nil {
		d.addLine(n.Line, path, "invalid time %s (write an RFC 3339 time such as 2026-12-02T10:00:00Z)", quoteShort(n.Value))
	}
	return t
}

// guard decodes the short form (a mode) or the scoped form ({mode, match}).
func (d *decoder) guard(n *yaml.Node, path string) Guard {
	var g Guard
	if n.Kind == yaml.ScalarNode {
		g.Mode = Mode(d.str(n, path))
		return g
	}
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mode or a mapping {mode, match}, got %s", d.describe(n))
		return g
	}
	d.fields(n, path, guardFields, func(key, path string, v *yaml.Node) {
		switch key {
		case "mode":
			g.Mode = Mode(d.str(v, path))
		case "match":
			g.Match = d.stringMap(v, path)
		}
	})
	return g
}

// str accepts any non-null scalar as its text: match: {port: 5432} means the tag value
// "5432", exactly as written.
func (d *decoder) str(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.addLine(n.Line, path, "expected a string, got %s", d.describe(n))
		return ""
	}
	return n.Value
}

func (d *decoder) stringMap(n *yaml.Node, path string) map[string]string {
	m := map[string]string{}
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mapping, got %s", d.describe(n))
		return m
	}
	d.fields(n, path, nil, func(key, path string, v *yaml.Node) { m[key] = d.str(v, path) })
	return m
}

func (d *decoder) int(n *yaml.Node, path string) int {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.addLine(n.Line, path, "expected an integer, got %s", d.describe(n))
		return 0
	}
	if plainDecimal(n.Value, false) {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v
		}
	}
	var v int
	if n.Decode(&v) != nil {
		d.addLine(n.Line, path, "expected an integer, got %s", d.describe(n))
	}
	return v
}

func (d *decoder) float(n *yaml.Node, path string) float64 {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		d.addLine(n.Line, path, "expected a number, got %s", d.describe(n))
		return 0
	}
	if plainDecimal(n.Value, true) {
		if v, err := strconv.ParseFloat(n.Value, 64); err == nil {
			return v
		}
	}
	var v float64
	if n.Decode(&v) != nil {
		d.addLine(n.Line, path, "expected a number, got %s", d.describe(n))
	}
	return v
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

func (d *decoder) duration(n *yaml.Node, path string) Duration {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.addLine(n.Line, path, "expected a duration such as 2s, got %s", d.describe(n))
		return 0
	}
	v, err := parseDuration(n.Value)
	if err != nil {
		d.addLine(n.Line, path, "%v", err)
	}
	return v
}

// threshold reads a throttle_when value: a number or, for metrics measured in seconds
// (replication_lag, custom), also a duration.
func (d *decoder) threshold(n *yaml.Node, path, key string) float64 {
	if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
		return d.float(n, path)
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" &&
		(key == MetricReplicationLag || strings.HasPrefix(key, CustomMetricPrefix)) {
		v, err := parseDuration(n.Value)
		if err != nil {
			d.addLine(n.Line, path, "%v", err)
		}
		return seconds(v)
	}
	d.addLine(n.Line, path, "expected a number, got %s", d.describe(n))
	return 0
}

// seconds converts d to seconds without the float rounding of time.Duration.Seconds for
// whole-second values, so "5s" reads as exactly 5.
func seconds(d Duration) float64 {
	sec, ns := int64(d)/1e9, int64(d)%1e9
	return float64(sec) + float64(ns)/1e9
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

// suggest returns the known field closest to key when it is close enough to be a typo.
func suggest(key string, known []string) string {
	best, bestDist := "", math.MaxInt
	for _, k := range known {
		if dist := editDistance(key, k); dist < bestDist {
			best, bestDist = k, dist
		}
	}
	if bestDist <= max(2, len(key)/4) {
		return best
	}
	return ""
}

// editDistance is the Levenshtein distance between short ASCII field names.
func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return math.MaxInt
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
