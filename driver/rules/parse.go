package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

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
			cfg, err = nil, &Error{Msg: fmt.Sprintf("cannot parse the file: %v", r)}
		}
	}()
	root, ok := jsonTree(data)
	if !ok {
		root, ok = subsetTree(data)
	}
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

// decoder walks a YAML node tree into a Config. It does the walking itself rather than
// through yaml.Node.Decode because custom decoding would lose the decoder's KnownFields
// strictness, and because it records where each field is, for the checks that follow.
type decoder struct {
	problems
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

// fields iterates over a mapping's pairs: it checks that n is a mapping with scalar,
// distinct keys, and calls fn for each pair whose value is not null (null means omitted).
func (d *decoder) fields(n *yaml.Node, path string, fn func(key string, keyPath string, v *yaml.Node)) {
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mapping, got %s", describe(n))
		return
	}
	var seen map[string]int // for large mappings; small ones are searched
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.resolve(n.Content[i], path), d.resolve(n.Content[i+1], path)
		if k == nil || v == nil {
			continue
		}
		if k.Kind != yaml.ScalarNode || isNull(k) {
			d.addLine(k.Line, path, "keys must be strings, got %s", describe(k))
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
		if first, dup := firstKey(n, i, k, &seen); dup {
			d.addLine(k.Line, kp, "duplicate key (first on line %d)", first)
			continue
		}
		if isNull(v) {
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
		d.addLine(n.Line, path, "expected a list, got %s", describe(n))
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

func (d *decoder) unknown(n *yaml.Node, path, key string, known ...string) {
	msg := "unknown field"
	if s := suggest(key, known); s != "" {
		msg += " (did you mean " + s + "?)"
	}
	line, ok := findLine(d.root, path) // the key's line: the value may start on a later one
	if !ok {
		line = n.Line
	}
	d.addLine(line, path, "%s", msg)
}

var (
	configFields = []string{"server_cores", "health_interval", "health_queries", "budgets", "rules", "guards", "coordination"}
	budgetFields = []string{"name", "mode", "max_concurrent", "per_query_limit", "server_share", "burst_limit",
		"warning_threshold", "per", "max_wait", "throttle_when", "explain", "shared"}
	ruleFields  = []string{"budget", "match"}
	guardsField = []string{"require_where", "block_truncate"}
	guardFields = []string{"mode", "match"}
)

func (d *decoder) config(n *yaml.Node, c *Config) {
	d.fields(n, "", func(key, path string, v *yaml.Node) {
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
				d.fields(v, p, func(key, path string, v *yaml.Node) {
					switch key {
					case "budget":
						r.Budget = d.str(v, path)
					case "match":
						r.Match = d.stringMap(v, path)
					default:
						d.unknown(v, path, key, ruleFields...)
					}
				})
				c.Rules = append(c.Rules, r)
			})
		case "guards":
			d.fields(v, path, func(key, path string, v *yaml.Node) {
				switch key {
				case "require_where":
					c.Guards.RequireWhere = d.guard(v, path)
				case "block_truncate":
					c.Guards.BlockTruncate = d.guard(v, path)
				default:
					d.unknown(v, path, key, guardsField...)
				}
			})
		case "coordination":
			c.Coordination = d.coordination(v, path)
		default:
			d.unknown(v, path, key, configFields...)
		}
	})
}

func (d *decoder) budget(n *yaml.Node, path string, b *Budget) {
	d.fields(n, path, func(key, path string, v *yaml.Node) {
		switch key {
		case "name":
			b.Name = d.str(v, path)
		case "mode":
			b.Mode = Mode(d.str(v, path))
		case "max_concurrent":
			b.MaxConcurrent = d.int(v, path)
		case "per_query_limit":
			b.PerQueryLimit = d.duration(v, path)
		case "server_share":
			b.ServerShare = d.float(v, path)
		case "burst_limit":
			b.BurstLimit = d.duration(v, path)
		case "warning_threshold":
			b.WarningThreshold = d.float(v, path)
		case "per":
			b.Per = d.str(v, path)
		case "max_wait":
			b.MaxWait = d.duration(v, path)
		case "throttle_when":
			b.ThrottleWhen = map[string]float64{}
			d.fields(v, path, func(key, path string, v *yaml.Node) {
				b.ThrottleWhen[key] = d.threshold(v, path, key)
			})
		case "explain":
			b.Explain = d.str(v, path)
		case "shared":
			b.Shared = d.boolean(v, path)
		default:
			d.unknown(v, path, key, budgetFields...)
		}
	})
}

// guard decodes the short form (a mode) or the scoped form ({mode, match}).
func (d *decoder) guard(n *yaml.Node, path string) Guard {
	var g Guard
	if n.Kind == yaml.ScalarNode {
		g.Mode = Mode(d.str(n, path))
		return g
	}
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mode or a mapping {mode, match}, got %s", describe(n))
		return g
	}
	d.fields(n, path, func(key, path string, v *yaml.Node) {
		switch key {
		case "mode":
			g.Mode = Mode(d.str(v, path))
		case "match":
			g.Match = d.stringMap(v, path)
		default:
			d.unknown(v, path, key, guardFields...)
		}
	})
	return g
}

// str accepts any non-null scalar as its text: match: {port: 5432} means the tag value
// "5432", exactly as written.
func (d *decoder) str(n *yaml.Node, path string) string {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.addLine(n.Line, path, "expected a string, got %s", describe(n))
		return ""
	}
	return n.Value
}

func (d *decoder) stringMap(n *yaml.Node, path string) map[string]string {
	m := map[string]string{}
	if n.Kind != yaml.MappingNode {
		d.addLine(n.Line, path, "expected a mapping, got %s", describe(n))
		return m
	}
	// fields skips nulls as omitted; in a map a null value is a mistake (match: {app: }).
	for i := 1; i < len(n.Content); i += 2 {
		if v := d.resolve(n.Content[i], path); v != nil && isNull(v) {
			k := n.Content[i-1]
			d.addLine(v.Line, keyPath(path, k.Value), "expected a string, got null")
		}
	}
	d.fields(n, path, func(key, path string, v *yaml.Node) { m[key] = d.str(v, path) })
	return m
}

func (d *decoder) int(n *yaml.Node, path string) int {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.addLine(n.Line, path, "expected an integer, got %s", describe(n))
		return 0
	}
	if plainDecimal(n.Value, false) {
		if v, err := strconv.Atoi(n.Value); err == nil {
			return v
		}
	}
	var v int
	if n.Decode(&v) != nil {
		d.addLine(n.Line, path, "expected an integer, got %s", describe(n))
	}
	return v
}

func (d *decoder) float(n *yaml.Node, path string) float64 {
	if n.Kind != yaml.ScalarNode || (n.ShortTag() != "!!int" && n.ShortTag() != "!!float") {
		d.addLine(n.Line, path, "expected a number, got %s", describe(n))
		return 0
	}
	if plainDecimal(n.Value, true) {
		if v, err := strconv.ParseFloat(n.Value, 64); err == nil {
			return v
		}
	}
	var v float64
	if n.Decode(&v) != nil {
		d.addLine(n.Line, path, "expected a number, got %s", describe(n))
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
		d.addLine(n.Line, path, "expected a duration such as 2s, got %s", describe(n))
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
	d.addLine(n.Line, path, "expected a number, got %s", describe(n))
	return 0
}

// seconds converts d to seconds without the float rounding of time.Duration.Seconds for
// whole-second values, so "5s" reads as exactly 5.
func seconds(d Duration) float64 {
	sec, ns := int64(d)/1e9, int64(d)%1e9
	return float64(sec) + float64(ns)/1e9
}

// describe names a node's kind for a message, quoting short scalars (rules-file text,
// never SQL or bound values).
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
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
