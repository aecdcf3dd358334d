package rules

import (
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// findLine walks the decoded file root along a field path ("budgets[3].max_wait",
// `health_queries["my load"]`), as keyPath and indexPath build them, and returns the line the
// field is written on: a mapping key's line (its value may start on a later one) or a list
// element's. ok is false when the path is not in the file or its value is null (omitted).
//
// Lines are found on demand, when a problem is reported or a zero value must be told from an
// omitted one, rather than recorded for every field while decoding: a file may hold a budget per
// tenant, and the walk costs a few key comparisons per step.
func findLine(root *yaml.Node, path string) (line int, ok bool) {
	n, rest := root, path
	for rest != "" {
		n = follow(n)
		if n == nil {
			return 0, false
		}
		switch {
		case strings.HasPrefix(rest, "[\""):
			q, err := strconv.QuotedPrefix(rest[1:])
			if err != nil || !strings.HasPrefix(rest[1+len(q):], "]") {
				return 0, false
			}
			key, err := strconv.Unquote(q)
			if err != nil {
				return 0, false
			}
			n, line = value(n, key)
			rest = rest[1+len(q)+1:]
		case rest[0] == '[':
			end := strings.IndexByte(rest, ']')
			i, err := strconv.Atoi(rest[1:max(end, 1)])
			if end < 0 || err != nil || n.Kind != yaml.SequenceNode || i < 0 || i >= len(n.Content) {
				return 0, false
			}
			n = follow(n.Content[i])
			if n == nil {
				return 0, false
			}
			line, rest = n.Line, rest[end+1:]
		default:
			rest = strings.TrimPrefix(rest, ".")
			// Keys may hold dots (custom.load): take the key that the rest of the path
			// continues after, the longest when several do.
			var key *yaml.Node
			if n.Kind == yaml.MappingNode {
				for i := 0; i+1 < len(n.Content); i += 2 {
					k := follow(n.Content[i])
					if k == nil || k.Kind != yaml.ScalarNode || !strings.HasPrefix(rest, k.Value) {
						continue
					}
					if r := rest[len(k.Value):]; r != "" && r[0] != '.' && r[0] != '[' {
						continue
					}
					if key == nil || len(k.Value) > len(key.Value) {
						key = k
					}
				}
			}
			if key == nil {
				return 0, false
			}
			n, line = value(n, key.Value)
			rest = rest[len(key.Value):]
		}
		if n == nil || isNull(n) {
			return 0, false
		}
	}
	return line, n != root
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

// follow resolves an alias, as decoder.resolve does, or returns nil for a chain too long.
func follow(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i == 8 {
			return nil
		}
		n = n.Alias
	}
	return n
}
