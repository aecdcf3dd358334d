package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// syntaxError turns a YAML parser error ("yaml: line 3: did not find ...") into an *Error.
// The YAML parser names no line for bytes it cannot read (invalid UTF-8, control characters)
// nor for a problem on the first line, and a misleading one for text after a complete JSON
// document, so those are located here.
//
// The YAML parser quotes a name from the file in a few messages (unknown anchor 'x'): the quoted
// part is removed, as the file may be anything but a rules file.
func syntaxError(data []byte, err error) *Error {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	if i := strings.Index(msg, "anchor '") + len("anchor "); i >= len("anchor ") {
		if j := strings.LastIndexByte(msg, '\''); j > i {
			msg = msg[:i] + "(name not shown)" + msg[j+1:]
		}
	}
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if n, tail, ok := strings.Cut(rest, ": "); ok {
			if l, err := strconv.Atoi(n); err == nil {
				line, msg = l, tail
			}
		}
	}
	if line == 0 {
		if e := badCharacter(data); e != nil {
			return e
		}
	}
	if e := afterJSON(data); e != nil {
		return e
	}
	if line == 0 {
		// The YAML parser counts lines from 0 and names none when the problem is on line 0.
		line = 1
	}
	return &Error{Line: line, Msg: msg}
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

// afterJSON finds text after a complete JSON document ({"budgets": []} }), which the YAML
// parser reports as a missing document start, on the line where the document began. It returns
// nil when the file does not start with a valid JSON document followed by more than
// whitespace.
func afterJSON(data []byte) *Error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' && trimmed[0] != '[' {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	var doc json.RawMessage
	if dec.Decode(&doc) != nil {
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
