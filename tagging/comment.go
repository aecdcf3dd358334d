package tagging

import (
	"bytes"
	"strings"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
)

// This file reads and writes tags as sqlcommenter comments
// (https://google.github.io/sqlcommenter/spec/):
//
//	SELECT * FROM orders /*app='billing',route='%2Forders%2F%7Bid%7D'*/;
//
// Keys and values are percent-encoded, values are single-quoted, pairs are
// sorted by key and joined with ",".

// Append returns sql with tags appended as a sqlcommenter comment, placed
// after the statement and before any trailing semicolons and whitespace:
// "SELECT 1;" becomes "SELECT 1 /*a='b'*/;".
//
// Keys and values are percent-encoded: every byte other than an ASCII letter,
// digit, '-', '_', '.' or '~' becomes %XX, so a space is %20, and "'", "*" and
// "/" are encoded too. The comment is therefore plain ASCII whatever the tags
// hold, and neither "*/" nor a nested "/*" can appear inside it. (The spec's
// escape of "'" as "\'" has nothing left to do after this encoding.)
//
// The spec says a statement that already contains a comment must not be
// mutated, so Append returns sql unchanged when it contains "/*" or "--"
// anywhere, even inside a string literal or quoted identifier: it errs
// toward leaving the statement alone rather than lexing SQL.
//
// A pair whose key is longer than 64 bytes or whose value is longer than 256
// is left out, as [Parse] leaves it out: a context tag holding a request
// header or a document must not be copied into every statement sent. Append
// returns sql unchanged when no pair is left.
func Append(sql string, tags Tags) string {
	n, kept := len(sql)+len(" /**/"), 0 // n: an upper bound of the length
	for _, p := range tags.pairs {
		if fits(p) {
			n += len("='',") + encodedLen(p.k) + encodedLen(p.v)
			kept++
		}
	}
	if kept == 0 || strings.Contains(sql, "/*") || strings.Contains(sql, "--") {
		return sql
	}
	stmt := trimTrailing(sql)
	tail := sql[len(stmt):]

	var b strings.Builder
	b.Grow(n)
	b.WriteString(stmt)
	if stmt != "" {
		b.WriteByte(' ')
	}
	b.WriteString("/*")
	first := true
	for _, p := range tags.pairs {
		if !fits(p) {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		encode(&b, p.k)
		b.WriteString("='")
		encode(&b, p.v)
		b.WriteByte('\'')
	}
	b.WriteString("*/")
	b.WriteString(tail)
	return b.String()
}

// Parse returns the sqlcommenter tags of sql: those in the comment that ends
// the statement, ignoring trailing whitespace and semicolons, or, when the
// statement does not end with a comment, those in a comment that begins it
// (where tools such as Rails' marginalia can put it). Only one comment is
// read: the trailing one when there is one; comments elsewhere are ignored.
//
// Keys and values are decoded as the spec says: "\'" (any backslash-escaped
// byte) is unescaped, then percent-escapes are decoded, and "+" is read as a
// space, as form-encoders write it (a strict encoder such as [Append] always
// writes a literal "+" as %2B). Spaces around pairs are allowed. A pair that
// does not parse (no "=", an unquoted or unterminated value, a bad
// percent-escape, an empty key) is skipped; Parse never fails. When a key
// repeats, its last value wins. The comment is untrusted input, so a pair
// whose decoded key is longer than 64 bytes or whose value is longer than
// 256 is skipped too, and only the first 32 pairs are read.
//
// The comment is recognised by its shape alone, without lexing the SQL
// before it: a line comment or string literal that happens to end with
// "/*k='v'*/" reads as tags too. Tags from comments are only as trustworthy
// as whoever wrote the SQL text; context tags override them in the driver.
//
// A statement without such a comment costs a few byte comparisons and no
// allocation.
func Parse(sql string) Tags {
	body, ok := trailingComment(sql)
	if !ok {
		body, ok = leadingComment(sql)
	}
	if !ok {
		return Tags{}
	}
	return parsePairs(body)
}

// trimTrailing returns sql without the whitespace and semicolons that end it.
// A hand loop: this runs on every statement, comment or not.
func trimTrailing(sql string) string {
	i := len(sql)
	for i > 0 && (isSpace(sql[i-1]) || sql[i-1] == ';') {
		i--
	}
	return sql[:i]
}

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// trailingComment returns the text inside a /*...*/ comment that ends sql.
func trailingComment(sql string) (string, bool) {
	s := trimTrailing(sql)
	if !strings.HasSuffix(s, "*/") {
		return "", false
	}
	s = s[:len(s)-2]
	i := strings.LastIndex(s, "/*")
	if i < 0 {
		return "", false
	}
	body := s[i+2:]
	if strings.Contains(body, "*/") {
		return "", false // "/*a*/b*/": the final "*/" closes nothing of ours
	}
	return body, true
}

// leadingComment returns the text inside a /*...*/ comment that begins sql.
func leadingComment(sql string) (string, bool) {
	i := 0
	for i < len(sql) && isSpace(sql[i]) {
		i++
	}
	s := sql[i:]
	if !strings.HasPrefix(s, "/*") {
		return "", false
	}
	s = s[2:]
	j := strings.Index(s, "*/")
	if j < 0 {
		return "", false
	}
	body := s[:j]
	if strings.Contains(body, "/*") {
		return "", false // PostgreSQL nests comments; a nested one is not ours
	}
	return body, true
}

// maxCommentPairs bounds the pairs Parse reads from one comment.
const maxCommentPairs = 32

// parsePairs decodes key='value',... from a comment body, skipping
// malformed and over-long pairs.
func parsePairs(body string) Tags {
	var (
		ends []int        // each kept pair's key end and value end in buf, the next key after it
		buf  bytes.Buffer // the kept pairs' decoded keys and values, back to back
	)
	for pos := 0; pos < len(body) && len(ends) < 2*maxCommentPairs; {
		rawKey, rawVal, next, ok := scanPair(body, pos)
		if !ok {
			pos = next
			continue
		}
		if ends == nil {
			// At most one pair per remaining comma, plus the last.
			ends = make([]int, 0, 2*min(strings.Count(body[pos:], ",")+1, maxCommentPairs))
			buf.Grow(len(body)) // decoding never lengthens
		}
		pos = next
		k0 := buf.Len()
		if !decode(&buf, rawKey) || buf.Len() == k0 || buf.Len()-k0 > bounded.KeyLen {
			buf.Truncate(k0)
			continue
		}
		v0 := buf.Len()
		if !decode(&buf, rawVal) || buf.Len()-v0 > bounded.ValueLen {
			buf.Truncate(k0)
			continue
		}
		ends = append(ends, v0, buf.Len())
	}
	if len(ends) == 0 {
		return Tags{}
	}
	// One string of what the tags hold, copied out of buf, which is as large as the whole
	// comment: a tag kept (a budget's key per tenant, a span's attribute) must not keep a
	// megabyte comment alive with it.
	all := buf.String()
	ps := make([]pair, 0, len(ends)/2)
	for i, k0 := 0, 0; i < len(ends); i += 2 {
		ps = append(ps, pair{all[k0:ends[i]], all[ends[i]:ends[i+1]]})
		k0 = ends[i+1]
	}
	return Tags{normalize(ps)}
}

// fits reports whether p is within the bounds a comment's pair is read with (parsePairs).
func fits(p pair) bool { return len(p.k) <= bounded.KeyLen && len(p.v) <= bounded.ValueLen }

// scanPair reads one key='value' pair starting at pos and returns the raw
// (still encoded) key and value and the position after the pair and its
// separating comma. When the pair is malformed, ok is false and next skips
// to after the next comma.
func scanPair(body string, pos int) (rawKey, rawVal string, next int, ok bool) {
	skip := func(from int) int {
		if c := strings.IndexByte(body[from:], ','); c >= 0 {
			return from + c + 1
		}
		return len(body)
	}
	// The key ends at the first '=' or ','; a comma first makes the pair malformed. Looking for
	// both at once keeps a comment of many commas before one '=' linear.
	eq := strings.IndexAny(body[pos:], "=,")
	if eq < 0 {
		return "", "", len(body), false
	}
	if body[pos+eq] == ',' {
		return "", "", pos + eq + 1, false
	}
	rawKey = strings.TrimSpace(body[pos : pos+eq])
	p := skipSpace(body, pos+eq+1)
	if p >= len(body) || body[p] != '\'' {
		return "", "", skip(p), false
	}
	p++
	start := p
	for p < len(body) && body[p] != '\'' {
		if body[p] == '\\' {
			p++ // the escaped byte, whatever it is, is part of the value
		}
		p++
	}
	if p >= len(body) {
		return "", "", len(body), false // unterminated
	}
	rawVal = body[start:p]
	p = skipSpace(body, p+1)
	switch {
	case p >= len(body):
		return rawKey, rawVal, p, true
	case body[p] == ',':
		return rawKey, rawVal, p + 1, true
	default:
		return "", "", skip(p), false // junk after the value
	}
}

func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// decode appends the decoded form of raw to b: backslash escapes removed,
// then percent-escapes and "+" decoded. It reports false for a truncated or
// non-hex percent-escape.
func decode(b *bytes.Buffer, raw string) bool {
	if !strings.ContainsAny(raw, "%+\\") {
		b.WriteString(raw) // the common case: nothing to decode
		return true
	}
	// at returns the byte at i with a backslash escape removed, and the index
	// after it; fusing both decoding steps into one pass needs no buffer.
	at := func(i int) (byte, int) {
		if raw[i] == '\\' && i+1 < len(raw) {
			return raw[i+1], i + 2
		}
		return raw[i], i + 1
	}
	for i := 0; i < len(raw); {
		c, j := at(i)
		switch c {
		case '%':
			if j >= len(raw) {
				return false
			}
			h, j := at(j)
			if j >= len(raw) {
				return false
			}
			l, j := at(j)
			hv, ok1 := unhex(h)
			lv, ok2 := unhex(l)
			if !ok1 || !ok2 {
				return false
			}
			b.WriteByte(hv<<4 | lv)
			i = j
		case '+':
			b.WriteByte(' ')
			i = j
		default:
			b.WriteByte(c)
			i = j
		}
	}
	return true
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// unreserved reports whether c is written as itself: RFC 3986's unreserved
// set, as url.QueryEscape has it.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '-' || c == '_' || c == '.' || c == '~'
}

func encodedLen(s string) int {
	n := len(s)
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			n += 2
		}
	}
	return n
}

// encode appends s percent-encoded to b, with a space as %20 as the spec's
// examples have it (not "+").
func encode(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}
