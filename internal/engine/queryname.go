package engine

import "strings"

// sqlc marks each generated statement with a leading "-- name: <Name> <:command>" line.
const (
	queryNamePrefix = "-- name: "
	// maxQueryNameLen bounds the name read: a longer one gives no tag. The name is an identifier
	// chosen in the application's query files, not data, but the text is not ours to trust.
	maxQueryNameLen = 128
	// maxLeadingSpace bounds the white space skipped before the comment.
	maxLeadingSpace = 64
)

// queryName returns the name in query's leading sqlc comment ("-- name: ListOrders :many" gives
// "ListOrders"), or "" when the text does not begin with one. The name must be an ASCII
// identifier, followed by white space or the end of the text. It reads the statement's own
// text, not its pattern: the pattern cache's key drops leading comments, so two sqlc queries
// with the same body share a pattern but not a name.
func queryName(query string) string {
	i := 0
	for i < len(query) && i < maxLeadingSpace && isSpace(query[i]) {
		i++
	}
	if !strings.HasPrefix(query[i:], queryNamePrefix) {
		return ""
	}
	start := i + len(queryNamePrefix)
	end := start
	for end < len(query) && end-start <= maxQueryNameLen && isIdentByte(query[end], end == start) {
		end++
	}
	if end == start || end-start > maxQueryNameLen || (end < len(query) && !isSpace(query[end])) {
		return ""
	}
	// Cloned: the tags outlive the statement (a span keeps them), and the caller's string may
	// be built over a buffer it will reuse (unsafe.String).
	return strings.Clone(query[start:end])
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// isIdentByte reports whether c may stand in an identifier (first: at its start).
func isIdentByte(c byte, first bool) bool {
	switch {
	case c == '_', 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z':
		return true
	case '0' <= c && c <= '9':
		return !first
	}
	return false
}
