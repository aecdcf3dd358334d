package bounded

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// The bounds of a tag, in bytes. A comment's pair past them is skipped; a route or an
// attribute past them is cut.
const (
	KeyLen   = 64
	ValueLen = 256
)

// QueryLen bounds a statement's normalised text: package pattern cuts it with [Cut] once, when
// it analyses the statement, so every span's db.query.text, debug log line and status entry
// carries at most this much of it. 4 KiB holds the whole of nearly every statement written by
// hand or built by an ORM, so what is cut is generated text (a bulk INSERT's VALUES rows, an IN
// list of thousands of parameters), whose first 4 KiB still show the statement and its shape:
// the rest repeats them. Bounded so, the status's texts (one for each of its recent refusal
// groups, hottest patterns and quarantines) stay small too.
const QueryLen = 4 << 10

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
// n is returned as is, without allocating; a cut one is a copy, so that what is kept (in a span
// that outlives its statement, a table of keys) does not hold the whole of s in memory.
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
	return strings.Clone(s[:n])
}

// Cut returns s as [Valid] makes it, within n bytes. Unlike [Text] it shows that it cut: a
// longer s is cut on a rune boundary and ends with "… (N bytes cut)", N the bytes left out, the
// whole within n. With n too small for that marker it cuts as Text does. A valid s within n is
// returned as is, without allocating.
func Cut(s string, n int) string {
	if len(s) <= n && utf8.ValidString(s) {
		return s
	}
	s = Valid(s)
	if len(s) <= n {
		return s
	}
	// Room for the marker with the digits of len(s): what is cut has no more.
	room := n - len(cutOpen) - decimalLen(len(s)) - len(cutClose)
	if room < 0 {
		return Text(s, n)
	}
	for room > 0 && !utf8.RuneStart(s[room]) {
		room--
	}
	var digits [20]byte
	var b strings.Builder
	b.Grow(n)
	b.WriteString(s[:room])
	b.WriteString(cutOpen)
	b.Write(strconv.AppendInt(digits[:0], int64(len(s)-room), 10))
	b.WriteString(cutClose)
	return b.String()
}

// The marker Cut ends a text it cut with, around the number of bytes cut.
const (
	cutOpen  = "… ("
	cutClose = " bytes cut)"
)

// decimalLen is the number of decimal digits of n >= 0.
func decimalLen(n int) int {
	d := 1
	for ; n >= 10; n /= 10 {
		d++
	}
	return d
}
