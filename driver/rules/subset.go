package rules

import (
	"slices"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// subsetTree reads a YAML file written in the plain subset of YAML that rules files use into
// the node tree the YAML parser builds for it, for [Parse] to decode as it decodes any file. It
// exists for the reason jsonTree does: the YAML parser is slow on a file of a budget per tenant.
//
// The subset: block mappings and block sequences laid out by indentation (an entry's mapping
// may start on the entry's line, a mapping's list may sit at the key's indentation), flow
// mappings and sequences on one line or several, plain scalars on one line, quoted scalars on
// one line, comments, blank lines and a leading ---. ok is false for anything else (anchors,
// aliases, tags, block scalars, scalars over several lines, directives, explicit keys, merge
// keys, tabs, a lone carriage return, a trailing comma, an empty value in a flow collection,
// indentation it does not expect) and for every error: the YAML parser then reads the file,
// so that what the subset leaves out, and every message, stays the YAML parser's. So the
// reader need not be complete, only exact where it accepts (FuzzYAMLSubset checks that).
//
// It is separate from jsonTree rather than one reader for both, though JSON is flow YAML:
// which JSON files are accepted is encoding/json's decision and their strings follow JSON's
// rules, which the YAML parser does not (an escaped /, a NEL kept as it is); one reader would
// have to carry both sets of rules.
func subsetTree(data []byte) (root *yaml.Node, ok bool) {
	if !subsetText(data) {
		return nil, false
	}
	defer func() {
		if r := recover(); r != nil {
			if _, declined := r.(declined); !declined {
				panic(r)
			}
			root, ok = nil, false
		}
	}()
	r := subsetReader{src: string(data), line: 1}
	r.skipLines()
	if r.indent == 0 && r.marker("---") {
		r.pos += 3
		r.endOfLine()
		r.skipLines()
	}
	r.noMarker()
	switch c := r.peek(0); {
	case r.indent < 0:
		r.decline() // an empty document: the YAML parser names the problem
	case c == '{' || c == '[':
		root = r.flowCollection(-1)
		r.endOfLine()
		r.nextLine()
	case r.entry() || r.startsKey():
		root = r.blockCollection(r.indent)
	default:
		r.decline() // a scalar document
	}
	if r.indent >= 0 {
		r.decline() // text after the root: a second document, or indentation it does not expect
	}
	return root, true
}

// subsetText reports whether data is text the reader handles: UTF-8 holding only characters
// that YAML reads as themselves, with no tab (whose place in indentation has its own rules)
// and with lines broken by \n or \r\n only.
func subsetText(data []byte) bool {
	for i := 0; i < len(data); {
		c := data[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c < 0x7F || c == '\n' || c == '\r' && i+1 < len(data) && data[i+1] == '\n' {
				i++
				continue
			}
			return false
		}
		r, size := utf8.DecodeRune(data[i:])
		// NEL, LS and PS break lines in YAML; a byte order mark is dropped.
		if r == utf8.RuneError || !printable(r) || r == 0x85 || r == 0x2028 || r == 0x2029 || r == 0xFEFF {
			return false
		}
		i += size
	}
	return true
}

// declined is the panic value that stops subsetReader at the first thing outside the subset.
type declined struct{}

// maxDepth bounds nesting: a rules file nests a few levels; the bound keeps recursion shallow.
const maxDepth = 64

// maxKeyLength is below the YAML parser's bound on a key's length (1024 characters), past
// which it stops reading a key as one.
const maxKeyLength = 1000

// subsetReader walks a file that subsetText accepted. In block context it stands, between
// nodes, at the first character of the next line that holds more than a comment.
type subsetReader struct {
	src       string
	pos       int
	line      int // the line pos is on
	lineStart int // the offset of that line
	indent    int // the indentation of the line pos stands on; -1 at the end of the file
	depth     int
	nodes     nodeBlock
	stack     []*yaml.Node // the children of the collections being read, innermost last
}

func (r *subsetReader) decline() { panic(declined{}) }

// peek returns the byte k bytes ahead, or 0 at the end (subsetText refused NUL).
func (r *subsetReader) peek(k int) byte {
	if r.pos+k < len(r.src) {
		return r.src[r.pos+k]
	}
	return 0
}

func isBreak(c byte) bool        { return c == '\n' || c == '\r' || c == 0 }
func isBreakOrSpace(c byte) bool { return c == ' ' || isBreak(c) }

// newline steps over the line break at pos.
func (r *subsetReader) newline() {
	if r.src[r.pos] == '\r' {
		r.pos++
	}
	r.pos++
	r.line++
	r.lineStart = r.pos
}

// comment reports whether a # at pos starts a comment as the reader takes it: after a space or
// at the start of a line. A # elsewhere is declined by the callers.
func (r *subsetReader) comment() bool {
	return r.peek(0) == '#' && (r.pos == r.lineStart || r.src[r.pos-1] == ' ')
}

// skipComment moves pos to the line break that ends a comment.
func (r *subsetReader) skipComment() {
	if i := strings.IndexAny(r.src[r.pos:], "\r\n"); i >= 0 {
		r.pos += i
	} else {
		r.pos = len(r.src)
	}
}

// endOfLine steps over what may follow a node on its line: spaces, a comment, the line break.
func (r *subsetReader) endOfLine() {
	for r.peek(0) == ' ' {
		r.pos++
	}
	if r.comment() {
		r.skipComment()
	}
	switch c := r.peek(0); {
	case c == 0:
	case c == '\n' || c == '\r':
		r.newline()
	default:
		r.decline()
	}
}

// nextLine moves from the start of a line to the first character of the next line that holds
// more than spaces and a comment, and sets r.indent.
func (r *subsetReader) nextLine() {
	r.skipLines()
	r.noMarker()
}

// noMarker declines a document marker at the start of the line pos stands on: the start or
// end of a document, outside a scalar or not.
func (r *subsetReader) noMarker() {
	if r.indent == 0 && (r.marker("---") || r.marker("...")) {
		r.decline()
	}
}

// skipLines is nextLine without the check for document markers.
func (r *subsetReader) skipLines() {
	for {
		for r.peek(0) == ' ' {
			r.pos++
		}
		if r.comment() {
			r.skipComment()
		}
		switch r.peek(0) {
		case 0:
			r.indent = -1
			return
		case '\n', '\r':
			r.newline()
			continue
		}
		r.indent = r.pos - r.lineStart
		return
	}
}

// marker reports whether a document marker (--- or ...) starts at pos.
func (r *subsetReader) marker(m string) bool {
	return strings.HasPrefix(r.src[r.pos:], m) && isBreakOrSpace(r.peek(3))
}

// node returns a new node of the current line.
func (r *subsetReader) node(kind yaml.Kind, style yaml.Style, tag string) *yaml.Node {
	n := r.nodes.next()
	*n = yaml.Node{Kind: kind, Style: style, Tag: tag, Line: r.line}
	return n
}

// null returns the empty scalar the YAML parser makes of an omitted value, on line.
func (r *subsetReader) null(line int) *yaml.Node {
	n := r.node(yaml.ScalarNode, 0, "!!null")
	n.Line = line
	return n
}

// enter starts reading a collection's children onto r.stack, from the returned mark.
func (r *subsetReader) enter() (mark int) {
	if r.depth++; r.depth > maxDepth {
		r.decline()
	}
	return len(r.stack)
}

// leave sets n's children, those on r.stack from mark: a slice of the exact size, allocated
// once rather than grown.
func (r *subsetReader) leave(n *yaml.Node, mark int) *yaml.Node {
	n.Content = slices.Clone(r.stack[mark:])
	r.stack = r.stack[:mark]
	r.depth--
	return n
}

// entry reports whether a block sequence entry (- followed by a space or a line break) is at pos.
func (r *subsetReader) entry() bool { return r.peek(0) == '-' && isBreakOrSpace(r.peek(1)) }

// blockCollection reads the block sequence or mapping that starts at pos, in column col.
func (r *subsetReader) blockCollection(col int) *yaml.Node {
	if r.entry() {
		return r.blockSequence(col, false)
	}
	return r.blockMapping(col)
}

// blockMapping reads a block mapping whose keys are in column col, the first at pos.
func (r *subsetReader) blockMapping(col int) *yaml.Node {
	mark := r.enter()
	n := r.node(yaml.MappingNode, 0, "!!map")
	for {
		k := r.key()
		if k == nil {
			r.decline()
		}
		r.stack = append(r.stack, k)
		r.stack = append(r.stack, r.blockValue(col, true))
		switch {
		case r.indent > col:
			r.decline()
		case r.indent < col:
			return r.leave(n, mark)
		}
	}
}

// blockSequence reads a block sequence whose entries are in column col, the first at pos. An
// indentless sequence, a mapping's value at the key's indentation, ends at the next key.
func (r *subsetReader) blockSequence(col int, indentless bool) *yaml.Node {
	mark := r.enter()
	n := r.node(yaml.SequenceNode, 0, "!!seq")
	for {
		r.pos++ // the -
		for r.peek(0) == ' ' {
			r.pos++
		}
		var v *yaml.Node
		switch {
		case isBreak(r.peek(0)) || r.comment():
			v = r.blockValue(col, false)
		case r.entry() || r.startsKey():
			v = r.blockCollection(r.pos - r.lineStart)
		default:
			v = r.inlineValue(col)
			r.endOfLine()
			r.nextLine()
		}
		r.stack = append(r.stack, v)
		switch {
		case r.indent > col:
			r.decline()
		case r.indent < col || !r.entry():
			if r.indent == col && !indentless {
				r.decline() // a key below an indented sequence
			}
			return r.leave(n, mark)
		}
	}
}

// blockValue reads the value after a key's colon, or after an entry's - with nothing more on
// its line, for a collection in column col. A mapping's list may sit in column col.
func (r *subsetReader) blockValue(col int, inMapping bool) *yaml.Node {
	line := r.line
	for r.peek(0) == ' ' {
		r.pos++
	}
	if !isBreak(r.peek(0)) && !r.comment() {
		v := r.inlineValue(col)
		r.endOfLine()
		r.nextLine()
		return v
	}
	r.endOfLine()
	r.nextLine()
	switch {
	case r.indent > col:
		return r.blockCollection(r.indent)
	case r.indent == col && inMapping && r.entry():
		return r.blockSequence(col, true)
	}
	return r.null(line)
}

// inlineValue reads a value that starts on the line of its key or entry, in a collection in
// column col: a scalar, or a flow collection whose further lines are indented past col.
func (r *subsetReader) inlineValue(col int) *yaml.Node {
	switch r.peek(0) {
	case '{', '[':
		return r.flowCollection(col)
	case '"', '\'':
		return r.quoted()
	}
	return r.plain(false)
}

// startsKey reports whether a block mapping key (a scalar then a colon) starts at pos.
func (r *subsetReader) startsKey() bool {
	pos, nodes := r.pos, r.nodes
	defer func() { r.pos, r.nodes = pos, nodes }()
	return r.key() != nil
}

// key reads a block mapping key and its colon, or returns nil, with pos unmoved, if there is
// none at pos.
func (r *subsetReader) key() *yaml.Node {
	if c := r.peek(0); c == '{' || c == '[' {
		return nil
	}
	start, nodes := r.pos, r.nodes
	k := r.scalar(false)
	for r.peek(0) == ' ' {
		r.pos++
	}
	if r.peek(0) != ':' || !isBreakOrSpace(r.peek(1)) || r.pos-start > maxKeyLength {
		r.pos, r.nodes = start, nodes
		return nil
	}
	r.pos++
	return k
}

// scalar reads a quoted or plain scalar.
func (r *subsetReader) scalar(flow bool) *yaml.Node {
	if c := r.peek(0); c == '"' || c == '\'' {
		return r.quoted()
	}
	return r.plain(flow)
}

// plain reads a plain scalar on one line. In flow context it ends at a flow indicator too.
func (r *subsetReader) plain(flow bool) *yaml.Node {
	c, next := r.peek(0), r.peek(1)
	if isBreakOrSpace(c) {
		r.decline()
	}
	if strings.IndexByte("-?:,[]{}#&*!|>'\"%@`", c) >= 0 &&
		(c != '-' || isBreakOrSpace(next) || strings.IndexByte(",[]{}", next) >= 0) {
		r.decline() // an indicator, or - followed by what may make it one
	}
	start, end := r.pos, r.pos
	for i := r.pos; i < len(r.src); i++ {
		c := r.src[i]
		if c == '\n' || c == '\r' || c == '#' && r.src[i-1] == ' ' ||
			c == ':' && (i+1 == len(r.src) || isBreakOrSpace(r.src[i+1])) ||
			flow && strings.IndexByte(",[]{}?", c) >= 0 {
			break
		}
		if c != ' ' {
			end = i + 1
		}
	}
	value := r.src[start:end]
	if value == "<<" {
		r.decline() // a merge key
	}
	n := r.node(yaml.ScalarNode, 0, "")
	n.Value = strings.Clone(value) // a copy: the config must not pin the whole file
	n.Tag = plainTag(n)
	r.pos = end
	return n
}

// plainTag returns the tag the YAML parser resolves a plain scalar to. Most scalars of a
// generated file are names, and the resolver is slow for them: a scalar that starts with a
// letter is a string unless it is one of YAML's words (true, false and null, in their three
// spellings), which start with t, f or n and are at most five letters long. Only those and
// the scalars that start otherwise are left to the resolver.
func plainTag(n *yaml.Node) string {
	v := n.Value
	c := v[0] | 0x20 // lower case, for a letter
	if c >= 'a' && c <= 'z' && (len(v) > len("false") || strings.IndexByte("tfn", c) < 0) {
		return "!!str"
	}
	return n.ShortTag()
}

// quoted reads a single- or double-quoted scalar on one line.
func (r *subsetReader) quoted() *yaml.Node {
	q := r.src[r.pos]
	n := r.node(yaml.ScalarNode, yaml.SingleQuotedStyle, "!!str")
	if q == '"' {
		n.Style = yaml.DoubleQuotedStyle
	}
	var b []byte // the value once an escape is met; until then it is a slice of the file
	start := r.pos + 1
	for i := start; ; i++ {
		if i >= len(r.src) || r.src[i] == '\n' || r.src[i] == '\r' {
			r.decline() // unterminated, or folded over lines
		}
		switch c := r.src[i]; {
		case c == q && q == '\'' && i+1 < len(r.src) && r.src[i+1] == '\'':
			b = append(append(b, r.src[start:i]...), '\'')
			i++
			start = i + 1
		case c == q:
			if b == nil {
				n.Value = strings.Clone(r.src[start:i])
			} else {
				n.Value = string(append(b, r.src[start:i]...))
			}
			r.pos = i + 1
			return n
		case c == '\\' && q == '"':
			b = append(b, r.src[start:i]...)
			b, i = r.escape(b, i)
			start = i + 1
		}
	}
}

// simpleEscapes are the YAML parser's one-character escapes in a double-quoted scalar.
var simpleEscapes = map[byte]string{
	'0': "\x00", 'a': "\a", 'b': "\b", 't': "\t", 'n': "\n", 'v': "\v", 'f': "\f", 'r': "\r",
	'e': "\x1b", ' ': " ", '"': "\"", '\'': "'", '\\': "\\",
	'N': "\u0085", '_': "\u00a0", 'L': "\u2028", 'P': "\u2029",
}

// escape appends the character that the escape at src[i] (a backslash) stands for, and returns
// the offset of the escape's last byte.
func (r *subsetReader) escape(b []byte, i int) ([]byte, int) {
	if i+1 >= len(r.src) {
		r.decline()
	}
	c := r.src[i+1]
	if s, ok := simpleEscapes[c]; ok {
		return append(b, s...), i + 1
	}
	var digits int
	switch c {
	case 'x':
		digits = 2
	case 'u':
		digits = 4
	case 'U':
		digits = 8
	}
	if digits == 0 || i+2+digits > len(r.src) {
		r.decline()
	}
	var v rune
	for _, d := range []byte(r.src[i+2 : i+2+digits]) {
		switch {
		case d >= '0' && d <= '9':
			v = v<<4 | rune(d-'0')
		case d >= 'a' && d <= 'f':
			v = v<<4 | rune(d-'a'+10)
		case d >= 'A' && d <= 'F':
			v = v<<4 | rune(d-'A'+10)
		default:
			r.decline()
		}
	}
	if !utf8.ValidRune(v) {
		r.decline() // a surrogate or past U+10FFFF: the YAML parser refuses it
	}
	return utf8.AppendRune(b, v), i + 1 + digits
}

// flowCollection reads a flow mapping or sequence at pos; its further lines must be indented
// past minIndent, the column of the block collection holding it (-1 for none).
func (r *subsetReader) flowCollection(minIndent int) *yaml.Node {
	mark := r.enter()
	mapping := r.src[r.pos] == '{'
	n := r.node(yaml.SequenceNode, yaml.FlowStyle, "!!seq")
	closing := byte(']')
	if mapping {
		n.Kind, n.Tag, closing = yaml.MappingNode, "!!map", '}'
	}
	r.pos++
	r.flowSpace(minIndent)
	if r.peek(0) == closing {
		r.pos++
		return r.leave(n, mark)
	}
	for {
		if mapping {
			k := r.flowValue(minIndent, true)
			for r.peek(0) == ' ' {
				r.pos++
			}
			if r.peek(0) != ':' {
				r.decline() // a key without a value, or its colon on another line
			}
			r.pos++
			r.flowSpace(minIndent)
			r.stack = append(r.stack, k)
		}
		if c := r.peek(0); c == ',' || c == closing {
			r.decline() // an empty value
		}
		r.stack = append(r.stack, r.flowValue(minIndent, false))
		r.flowSpace(minIndent)
		switch r.peek(0) {
		case closing:
			r.pos++
			return r.leave(n, mark)
		case ',':
			r.pos++
			r.flowSpace(minIndent)
			if c := r.peek(0); c == ',' || c == ']' || c == '}' {
				r.decline() // a trailing comma, or an empty entry
			}
		default:
			r.decline()
		}
	}
}

// flowValue reads a node in a flow collection: a key is a scalar on one line.
func (r *subsetReader) flowValue(minIndent int, key bool) *yaml.Node {
	start := r.pos
	switch c := r.peek(0); {
	case c == '{' || c == '[':
		if key {
			r.decline()
		}
		return r.flowCollection(minIndent)
	case c == '"' || c == '\'':
		n := r.quoted()
		if key && r.pos-start > maxKeyLength {
			r.decline()
		}
		return n
	}
	n := r.plain(true)
	if key && r.pos-start > maxKeyLength {
		r.decline()
	}
	// A plain scalar continues on the next line unless a flow indicator or a comment ends it.
	save, line, lineStart := r.pos, r.line, r.lineStart
	for r.peek(0) == ' ' {
		r.pos++
	}
	if c := r.peek(0); c == '\n' || c == '\r' {
		r.flowSpace(minIndent)
		if c := r.peek(0); c != ',' && c != ']' && c != '}' {
			r.decline()
		}
		r.pos, r.line, r.lineStart = save, line, lineStart
	}
	return n
}

// flowSpace skips spaces, comments and line breaks inside a flow collection.
func (r *subsetReader) flowSpace(minIndent int) {
	for {
		switch r.peek(0) {
		case ' ':
			r.pos++
		case '#':
			if !r.comment() {
				r.decline()
			}
			r.skipComment()
		case '\n', '\r':
			r.newline()
			for r.peek(0) == ' ' {
				r.pos++
			}
			if c := r.peek(0); c != '\n' && c != '\r' && c != 0 {
				if r.pos-r.lineStart <= minIndent || r.pos == r.lineStart && (r.marker("---") || r.marker("...")) {
					r.decline()
				}
			}
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
