package rules

import (
	"reflect"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// field is where a value sits in a rules file or a [Config]: the steps from the top, each a
// mapping key or a list index. It renders as the field path that a message names, in
// rules-file spelling (budgets[1].max_wait, health_queries["my load"]), and finds the value's
// node in a parsed file. It holds no pointer and is passed by value: a step costs a copy, and
// the path is rendered only for a message.
type field struct {
	steps [maxDepth]step
	n     int
}

// maxDepth is the deepest a rules file nests: a map entry within a field of a list element, as
// budgets[0].throttle_when.active_queries.
const maxDepth = 4

// step is a mapping key, or a list index when index >= 0.
type step struct {
	key   string
	index int
}

// key returns the field of the mapping at f named k.
func (f field) key(k string) field {
	f.steps[f.n] = step{key: k, index: -1}
	f.n++
	return f
}

// index returns element i of the list at f.
func (f field) index(i int) field {
	f.steps[f.n] = step{index: i}
	f.n++
	return f
}

// parent returns the field that f is a step of ("" for the top).
func (f field) parent() field {
	f.n--
	f.steps[f.n] = step{}
	return f
}

// String renders f as a message names it: keys joined by dots, or quoted in brackets (see
// [quoteShort]) when they would not read as one element of a path or are long, and list
// indexes in brackets.
func (f field) String() string {
	var b strings.Builder
	for i, s := range f.steps[:f.n] {
		switch {
		case s.index >= 0:
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.index))
			b.WriteByte(']')
		case simpleKey(s.key):
			if i > 0 {
				b.WriteByte('.')
			}
			b.WriteString(s.key)
		default:
			b.WriteByte('[')
			b.WriteString(quoteShort(s.key))
			b.WriteByte(']')
		}
	}
	return b.String()
}

// simpleKey reports whether key reads as one element of a dotted path. Dots are allowed: a
// custom metric is custom.<name>.
func simpleKey(key string) bool {
	if key == "" || len(key) > maxQuoted {
		return false
	}
	for _, c := range key {
		if !(c == '_' || c == '-' || c == '.' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// find returns the node written at f in the file rooted at root, and the line f is written on:
// a mapping key's line (its value may start on a later one) or a list element's. n is nil when
// f is not in the file, its value is null (omitted), or f is the top. Lines are looked up only
// for a problem, or to tell a written zero from an omitted one: a file may hold a budget per
// tenant.
func (f field) find(root *yaml.Node) (n *yaml.Node, line int) {
	if f.n == 0 {
		return nil, 0
	}
	n = root
	for _, s := range f.steps[:f.n] {
		if n = follow(n); n == nil {
			return nil, 0
		}
		if s.index >= 0 {
			if n.Kind != yaml.SequenceNode || s.index >= len(n.Content) {
				return nil, 0
			}
			if n = follow(n.Content[s.index]); n == nil {
				return nil, 0
			}
			line = n.Line
		} else {
			n, line = value(n, s.key)
		}
		if n == nil || isNull(n) {
			return nil, 0
		}
	}
	return n, line
}

// value returns the value of the first pair of mapping n whose key is key, and the key's line.
func value(n *yaml.Node, key string) (*yaml.Node, int) {
	if n.Kind != yaml.MappingNode {
		return nil, 0
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := follow(n.Content[i]); k != nil && k.Kind == yaml.ScalarNode && k.Value == key {
			return follow(n.Content[i+1]), k.Line
		}
	}
	return nil, 0
}

// follow resolves an alias, or returns nil for a chain too long (see decoder.resolve).
func follow(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == maxAliasChain {
			return nil
		}
		n = n.Alias
	}
	return n
}

// maxAliasChain bounds the aliases followed to reach a value.
const maxAliasChain = 8

// member returns the field of struct *s, which f is, at address p, named as its yaml tag names
// it: a check names a field by its Go field (at.member(b, &b.MaxWait)), and the name stays
// defined by the tag alone.
func (f field) member(s, p any) field {
	t := reflect.TypeOf(s).Elem()
	off := reflect.ValueOf(p).Pointer() - reflect.ValueOf(s).Pointer()
	if i := slices.Index(tagOffsets[t], off); i >= 0 {
		return f.key(tagNames[t][i])
	}
	panic("rules: not a field of " + t.Name())
}
