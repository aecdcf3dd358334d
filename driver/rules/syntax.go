package rules

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"
)

// syntaxError turns a YAML parser error ("yaml: line 3: did not find ...") into an *Error.
// The YAML parser names no line for bytes it cannot read (invalid UTF-8, control characters),
// and a misleading one for a problem in a JSON document, so those are located here; its parser
// (as opposed to its scanner) counts lines from 0 and names the line where the list or mapping
// enclosing a problem begins, which [yamlParserLine] makes a line counted from 1 and a message
// that says so.
//
// The YAML parser quotes a name from the file in a few messages (unknown anchor 'x'): the quoted
// part is removed, as the file may be anything but a rules file.
func syntaxError(data []byte, err error) *Error {
	line, msg := yamlErrorLine(err)
	if line == 0 {
		if e := badCharacter(data); e != nil {
			return e
		}
	}
	if _, parser := yamlParserProblems[msg]; parser {
		line, msg = yamlParserLine(data, line, msg)
	}
	if e := jsonError(data); e != nil && e.Line >= line {
		// Not before the YAML parser's line, which is at or above the problem: text read as YAML
		// (a flow mapping with unquoted keys) stops being JSON before its problem.
		return e
	}
	return &Error{Line: max(line, 1), Msg: msg}
}

// yamlErrorLine splits a YAML parser error into the line it names (0 for none) and its message,
// with any name quoted from the file removed.
func yamlErrorLine(err error) (line int, msg string) {
	msg = strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(msg, "anchor '") + len("anchor "); i >= len("anchor ") {
		if j := strings.LastIndexByte(msg, '\''); j > i {
			msg = msg[:i] + "(name not shown)" + msg[j+1:]
		}
	}
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				return l, tail
			}
		}
	}
	return 0, msg
}

// yamlParserProblems are the problems the YAML parser reports, each with the construct it names
// the line of: "" for the problem's own line, else the list, mapping or value enclosing the
// problem (unless that begins on the file's first line: then the problem's). Other messages
// come from its scanner, which names the problem's line, counted from 1.
var yamlParserProblems = map[string]string{
	"did not find expected ',' or ']'":       "list",
	"did not find expected '-' indicator":    "list",
	"did not find expected ',' or '}'":       "mapping",
	"did not find expected key":              "mapping",
	"did not find expected node content":     "value",
	"found undefined tag handle":             "value",
	"did not find expected <stream-start>":   "",
	"did not find expected <document start>": "",
	"found duplicate %YAML directive":        "",
	"found duplicate %TAG directive":         "",
	"found incompatible YAML document":       "",
}

// yamlParserLine returns the line, counted from 1, and the message for the YAML parser's
// problem msg, reported on line (counted from 0, as the parser counts). For a problem within a
// list or mapping, line is where that begins, unless it begins on the file's first line, which
// the parser does not name: then it is the problem's own. The file is read again after one more
// line, on which nothing begins, to tell the two apart. A problem found at the end of the file
// (a list not closed) is named on the file's last line of text.
func yamlParserLine(data []byte, line int, msg string) (int, string) {
	within := yamlParserProblems[msg]
	line++
	where, begins := "", 0
	if within != "" {
		dec := yaml.NewDecoder(io.MultiReader(strings.NewReader("\n"), bytes.NewReader(data)))
		var again error
		for range 2 { // the error [yamlTree] met, in the first document or the second
			var doc yaml.Node
			if again = dec.Decode(&doc); again != nil {
				break
			}
		}
		var m string
		if again != nil {
			begins, m = yamlErrorLine(again)
		}
		switch {
		case m != msg || begins == 0:
			// Not the same error (a byte order mark must come first): say no more than is known.
			begins, where = 0, "on this line, or in the "+within+" that begins on it"
		case begins == 1:
			where = "in the " + within + " that begins on line 1"
		default:
			line, where = begins, "in the "+within+" that begins on this line"
		}
	}
	if last := 1 + bytes.Count(bytes.TrimRight(data, " \t\r\n"), []byte("\n")); line > last {
		line, where = last, "at the end of the file"
		if begins == 1 {
			where += ", in the " + within + " that begins on line 1"
		}
	}
	if where == "" {
		return line, msg
	}
	return line, msg + " (" + where + ")"
}

// badCharacter finds the first byte sequence that a YAML stream may not hold: invalid UTF-8,
// or a character outside YAML's printable set (NUL and the other control characters except
// tab, line feed and carriage return). It returns nil when there is none, or when the file is
// not UTF-8 (a UTF-16 byte order mark: the YAML parser decodes it itself).
func badCharacter(data []byte) *Error {
	if bytes.HasPrefix(data, []byte{0xFE, 0xFF}) || bytes.HasPrefix(data, []byte{0xFF, 0xFE}) {
		return nil
	}
	for off := 0; off < len(data); {
		r, size := utf8.DecodeRune(data[off:])
		switch {
		case r == utf8.RuneError && size <= 1:
			return errorAt(data, off, fmt.Sprintf("invalid UTF-8 (byte 0x%02X): the file must be UTF-8 text", data[off]))
		case !printable(r):
			return errorAt(data, off, fmt.Sprintf("control character %U: the file must be text", r))
		}
		off += size
	}
	return nil
}

// printable reports whether YAML allows r in a stream (YAML 1.2, "c-printable").
func printable(r rune) bool {
	return r == 0x09 || r == 0x0A || r == 0x0D || r >= 0x20 && r <= 0x7E || r == 0x85 ||
		r >= 0xA0 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// jsonError locates the problem of a file that is JSON in intent (its text starts with { or [)
// but not valid JSON, as the JSON reader finds it: the YAML parser names the line where the
// list or mapping enclosing it begins, or for text after a complete document ({"budgets": []}
// }) a missing document start, on the line where the document began. It returns nil for a file
// that does not start with { or [, or is valid JSON.
func jsonError(data []byte) *Error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' && trimmed[0] != '[' {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var doc json.RawMessage
	var syntax *json.SyntaxError
	switch err := dec.Decode(&doc); {
	case errors.As(err, &syntax):
		// Offset is past the byte that ended the JSON. The message quotes that one character
		// at most, never a value.
		return errorAt(data, max(int(syntax.Offset)-1, 0), syntax.Error()+" (reading the file as JSON)")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errorAt(data, len(bytes.TrimRight(data, " \t\r\n")), "the JSON document ends before it is complete")
	case err != nil:
		return nil
	}
	end := int(dec.InputOffset())
	rest := bytes.TrimLeft(data[end:], " \t\r\n")
	if len(rest) == 0 {
		return nil
	}
	return errorAt(data, len(data)-len(rest), "text after the end of the JSON document")
}

// errorAt reports msg at byte offset off of data, naming its line, column and offset.
func errorAt(data []byte, off int, msg string) *Error {
	line := 1 + bytes.Count(data[:off], []byte("\n"))
	col := 1 + utf8.RuneCount(data[bytes.LastIndexByte(data[:off], '\n')+1:off])
	return &Error{Line: line, Msg: fmt.Sprintf("column %d (byte offset %d): %s", col, off, msg)}
}
