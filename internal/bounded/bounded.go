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

// Valid returns s with each run of invalid UTF-8 replaced by U+FFFD: OTLP's protobuf refuses to
// marshal a string that is not UTF-8, and an exporter then drops the whole batch. A valid s is
// returned as is, without allocating.
func Valid(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}

// Text returns s as [Valid] makes it, cut on a rune boundary to at most n bytes. A valid s within
// n is returned as is, without allocating.
func Text(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	s = Valid(s)
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
