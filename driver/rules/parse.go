package rules

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"

	"go.yaml.in/yaml/v3"
)

// Parse parses a rules file, YAML or JSON, validates it and returns it with the defaults that
// follow from no other field filled in: server_cores, health_interval, the modes, explain and
// the coordination section's own. The defaults that follow from other fields (burst_limit,
// max_queue, shared) stay omitted, so that a program may change the fields they follow (remove
// the coordination section for a run without Redis, say) and still have a valid config;
// [Config.WithDefaults] makes them explicit too.
//
// Decoding is strict and every problem names its line and field (see [Error]); all problems
// found are returned, joined. A file must hold exactly one document; an empty file (or one
// with only comments) is an error, so that a file caught half-written during a reload is not
// taken for "no rules" — write {} for that. YAML anchors and aliases are followed, up to a
// bound: a file whose aliases stand for more than 10 times its own values (and more than 10,000)
// is refused. Merge keys (<<) are not supported.
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

// emptyFile is the message of a file that holds no YAML document, or an empty one.
const emptyFile = "the file is empty (write {} for no rules)"

// decode builds a Config from a file's root node, checks it and fills in its defaults.
func decode(root *yaml.Node) (*Config, error) {
	var d decoder
	cfg := &Config{}
	root = d.resolve(root, field{})
	if root == nil || isNull(root) {
		line := 1
		if root != nil {
			line = max(root.Line, 1)
		}
		return nil, &Error{Line: line, Msg: emptyFile}
	}
	if msg := notRulesDocument(root); msg != "" {
		return nil, &Error{Line: max(root.Line, 1), Msg: msg}
	}
	d.root = root
	d.value(root, field{}, reflect.ValueOf(cfg).Elem())
	v := problems{root: root}
	cfg.validate(&v)
	failed := failedFields(d.errs)
	for _, e := range v.errs {
		// A field that failed to decode is left zero; do not report it again as missing.
		if !failed.near(e.Field) {
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
			return nil, &Error{Line: 1, Msg: emptyFile}
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
	root := &doc
	if doc.Kind == yaml.DocumentNode && len(doc.Content) == 1 {
		root = doc.Content[0]
	}
	if e := checkAliases(root); e != nil { // JSON, the other reader's, has no aliases
		return nil, e
	}
	return root, nil
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
		if names := tagNames[configType]; slices.Contains(names, k.Value) || suggest(k.Value, names) != "" {
			return ""
		}
	}
	if len(root.Content) == 0 {
		return "" // {}: no rules, written on purpose
	}
	return "not a rules file: none of its top-level keys is a field such as budgets or rules (its content is not shown)"
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
