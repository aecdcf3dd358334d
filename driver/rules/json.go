package rules

import (
	"encoding/json"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// jsonTree reads a JSON file into the node tree the YAML parser builds for it (JSON is YAML),
// for [Parse] to decode as it decodes any file: the same checks, messages and line numbers.
// It exists because the YAML parser is slow on a file of a budget per tenant, which is usually
// generated, and JSON (integration/PERFORMANCE.md measures both readers on such a file). ok is false when data is not valid UTF-8 JSON: the YAML parser then
// reads it and names the line of the problem.
//
// Lines are counted as the YAML parser counts them (\n, \r\n, a lone \r, and NEL, LS and PS
// inside strings), so that a problem names the same line either way; columns are not set.
// Strings are JSON's: unlike the YAML parser, it accepts an escaped / and keeps a NEL as it is
// rather than folding it into a space.
func jsonTree(data []byte) (root *yaml.Node, ok bool) {
	if !json.Valid(data) || !utf8.Valid(data) {
		return nil, false
	}
	r := jsonReader{src: string(data), line: 1}
	return r.value(), true
}

// jsonReader walks text that json.Valid accepted, so it checks nothing.
type jsonReader struct {
	src   string
	pos   int
	line  int // the line pos is on
	nodes nodeBlock
}

func (r *jsonReader) value() *yaml.Node {
	r.space()
	n := r.nodes.next()
	n.Line = r.line
	switch r.src[r.pos] {
	case '{':
		n.Kind, n.Style, n.Tag = yaml.MappingNode, yaml.FlowStyle, "!!map"
		r.members(n, '}')
	case '[':
		n.Kind, n.Style, n.Tag = yaml.SequenceNode, yaml.FlowStyle, "!!seq"
		r.members(n, ']')
	case '"':
		n.Kind, n.Style, n.Tag = yaml.ScalarNode, yaml.DoubleQuotedStyle, "!!str"
		n.Value = r.string()
	default: // a number, true, false or null: tagged as YAML resolves it
		start := r.pos
		for r.pos < len(r.src) && !strings.ContainsRune(",]} \t\r\n", rune(r.src[r.pos])) {
			r.pos++
		}
		n.Kind, n.Value = yaml.ScalarNode, strings.Clone(r.src[start:r.pos])
		n.Tag = n.ShortTag()
	}
	return n
}

// members reads the values of an object (keys and values alternating, as in a mapping node's
// Content) or an array, up to the closing byte.
func (r *jsonReader) members(n *yaml.Node, closing byte) {
	r.pos++ // the opening brace or bracket
	for {
		r.space()
		switch r.src[r.pos] {
		case closing:
			r.pos++
			return
		case ',', ':':
			r.pos++
		default:
			n.Content = append(n.Content, r.value())
		}
	}
}

// string reads a string token and returns its value.
func (r *jsonReader) string() string {
	start, escaped := r.pos, false
	for r.pos++; r.src[r.pos] != '"'; r.pos++ {
		switch c := r.src[r.pos]; {
		case c == '\\':
			escaped = true
			r.pos++ // the escaped byte, which may be a quote
		case c == 0xc2 && r.src[r.pos+1] == 0x85, // NEL
			c == 0xe2 && r.src[r.pos+1] == 0x80 && (r.src[r.pos+2] == 0xa8 || r.src[r.pos+2] == 0xa9): // LS, PS
			r.line++
		}
	}
	r.pos++
	text := r.src[start:r.pos]
	if !escaped {
		return strings.Clone(text[1 : len(text)-1]) // a copy: the config must not pin the whole file
	}
	var s string
	_ = json.Unmarshal([]byte(text), &s) // cannot fail: json.Valid accepted it
	return s
}

// space skips whitespace, counting lines.
func (r *jsonReader) space() {
	for ; r.pos < len(r.src); r.pos++ {
		switch r.src[r.pos] {
		case '\n':
			r.line++
		case '\r':
			if r.pos+1 == len(r.src) || r.src[r.pos+1] != '\n' {
				r.line++
			}
		case ' ', '\t':
		default:
			return
		}
	}
}

// nodeBlock hands out nodes allocated a block at a time: a generated file has millions.
type nodeBlock []yaml.Node

func (b *nodeBlock) next() *yaml.Node {
	if len(*b) == 0 {
		*b = make([]yaml.Node, 1024)
	}
	n := &(*b)[0]
	*b = (*b)[1:]
	return n
}
