// Package bounded holds the bounds of untrusted tag text (from sqlcommenter comments, request
// paths, and whatever else a client can choose) and the one function that applies them, so that
// the tag parser, the HTTP middleware and the span attributes agree.
package bounded

import (
	"strings"
	"unicode/utf8"
)

// The bounds of a tag, in bytes. A comment's pair past them is skipped; a route or an
// attribute past them is cut.
const (
	KeyLen   = 64
	ValueLen = 256
)

// Text returns s as valid UTF-8 of at most n bytes: each run of invalid bytes becomes U+FFFD
// (OTLP's protobuf refuses to marshal a string that is not UTF-8, and an exporter then drops the
// whole batch) and a longer string is cut on a rune boundary. A valid s within n is returned as
// is, without allocating.
func Text(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	s = strings.ToValidUTF8(s, "\uFFFD")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
