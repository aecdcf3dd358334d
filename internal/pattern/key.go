package pattern

import "strings"

// Key returns sql without leading and trailing whitespace, comments (-- and
// nested /* */) and semicolons. It is a substring of sql and never allocates.
//
// Comments are recognised as the PostgreSQL lexer (standard_conforming_strings
// on) recognises them, so "--" or "/*" inside a string literal, a quoted
// identifier or a dollar-quoted string is never taken for a comment. After a
// string that ends elsewhere with the setting off, nothing is stripped:
// '\' -- '; DELETE FROM t is a string and a comment with it on, a string and a
// DELETE with it off. Two texts with the same key
// differ only in what was stripped, which is why the cache may share one
// Pattern between them.
//
// The common cases are O(1) plus one vectorised search for "--": a text whose
// only comment is a leading one, or that has none. A text with a trailing
// comment (the usual sqlcommenter placement) or any "--" is lexed once from
// the start, O(len(sql)).
func Key(sql string) string {
	s := skipLeading(sql)
	t := sql[s:]
	e := len(t)
	for e > 0 && (isSpace(t[e-1]) || t[e-1] == ';') {
		e--
	}
	t = t[:e]
	// A trailing block comment must end the text with "*/"; a trailing line
	// comment needs a "--" somewhere. Without either, nothing more to strip.
	if !strings.HasSuffix(t, "*/") && !strings.Contains(t, "--") {
		return t
	}
	end, _ := significantEnd(sql[s:])
	return sql[s : s+end]
}

// skipLeading returns the offset of the first byte of sql that is not
// whitespace, a semicolon or part of a complete comment. At the start of a
// text the lexer is in its initial state, so this needs no lookbehind.
func skipLeading(sql string) int {
	i := 0
	for i < len(sql) {
		n, ok := filler(sql, i)
		if n == 0 || !ok {
			return i // a token, or an unterminated comment: the server reports it
		}
		i += n
	}
	return i
}

// filler returns the length of the whitespace byte, semicolon or comment that
// starts at sql[i] (a line comment runs to its newline, \n or \r as in
// PostgreSQL's lexer, or to the end), 0 where anything else starts; ok is false
// for an unterminated block comment.
func filler(sql string, i int) (n int, ok bool) {
	c := sql[i]
	switch {
	case isSpace(c) || c == ';':
		return 1, true
	case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
		if nl := strings.IndexAny(sql[i:], "\n\r"); nl >= 0 {
			return nl + 1, true
		}
		return len(sql) - i, true
	case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
		return blockComment(sql[i:])
	}
	return 0, true
}

// blockComment returns the length of the nested block comment that starts
// sql ("/*" at sql[0:2]) and whether it is terminated. Of an opener and a
// closer that overlap ("/*/"), the leftmost wins, as in PostgreSQL's lexer.
// It reads each byte once, however deep the nesting (the text is untrusted).
func blockComment(sql string) (int, bool) {
	depth, i := 1, 2
	for {
		j := strings.IndexAny(sql[i:], "/*")
		if j < 0 || i+j+1 >= len(sql) {
			return len(sql), false
		}
		i += j
		switch {
		case sql[i] == '/' && sql[i+1] == '*':
			depth++
			i += 2
		case sql[i] == '*' && sql[i+1] == '/':
			depth--
			i += 2
			if depth == 0 {
				return i, true
			}
		default:
			i++
		}
	}
}

// significantEnd lexes sql from the lexer's initial state and returns the end
// offset of its last token that is not whitespace, a comment or a semicolon.
// An unterminated string, identifier or comment is significant to the end, and
// so is a string that ends elsewhere with standard_conforming_strings off: then
// offDiffers is true, for the rest of the text is another with the setting off.
func significantEnd(sql string) (end int, offDiffers bool) {
	i := 0
	for i < len(sql) {
		n, ok := filler(sql, i)
		if !ok {
			return len(sql), false
		}
		if n > 0 {
			i += n
			continue
		}
		c := sql[i]
		if c == '\'' || c == '"' || c == '$' && (i == 0 || !isIdent(sql[i-1])) {
			n, ok = quotedToken(sql, i)
			if sql[i] == '\'' && !escapeString(sql, i) {
				// With the setting off, a backslash escapes in every string.
				if off, _ := quoted(sql[i:], '\'', true); off != n {
					return len(sql), true
				}
			}
			if !ok {
				return len(sql), false
			}
			i += n
		} else {
			// A run of bytes that start nothing: skip it whole.
			for i++; i < len(sql) && !lexSpecial[sql[i]]; i++ {
			}
		}
		end = i
	}
	return end, false
}

// dependsOnSetting reports whether sql, which pg_query reads with standard_conforming_strings
// on, is another text for a server with the setting off: some string ends elsewhere (see
// [Key]). A backslash before no quote ('C:\dir', '\d+') changes the string's value but not
// where it ends.
func dependsOnSetting(sql string) bool {
	if !strings.Contains(sql, `\'`) {
		return false // no string can end elsewhere
	}
	_, off := significantEnd(sql)
	return off
}

// offReading returns sql as a server with standard_conforming_strings off reads it, written for
// a parser with the setting on (pg_query): each string but an E'...' one made one, since with
// the setting off a backslash escapes in every string as in those. An unterminated token is
// kept so, for the parser to reject as that server does. ok is false where sql cannot be
// written so: a string that another prefix makes something else (B'...', X'...', N'...').
func offReading(sql string) (_ string, ok bool) {
	var b strings.Builder
	last := 0 // sql[last:] is still to be written
	for i := 0; i < len(sql); {
		n, _ := filler(sql, i) // an unterminated comment runs to the end
		switch c := sql[i]; {
		case n > 0:
		case c == '\'':
			escaped := escapeString(sql, i)
			if i > 0 && strings.IndexByte("bBxXnN", sql[i-1]) >= 0 && (i < 2 || !isIdent(sql[i-2])) {
				return "", false
			}
			n, _ = quoted(sql[i:], '\'', true)
			if !escaped {
				b.WriteString(sql[last:i])
				b.WriteByte('E')
				last = i
			}
		case c == '"' || c == '$' && (i == 0 || !isIdent(sql[i-1])):
			n, _ = quotedToken(sql, i)
		default:
			// A run of bytes that start nothing: skip it whole.
			for n = 1; i+n < len(sql) && !lexSpecial[sql[i+n]]; n++ {
			}
		}
		i += n
	}
	b.WriteString(sql[last:])
	return b.String(), true
}

// quotedToken returns the length of the string, quoted identifier or dollar-quoted string that
// starts at sql[i] (a quote, a double quote or a '$' that follows no identifier byte), and
// whether it is terminated.
func quotedToken(sql string, i int) (int, bool) {
	switch sql[i] {
	case '\'':
		return quoted(sql[i:], '\'', escapeString(sql, i))
	case '"':
		return quoted(sql[i:], '"', false)
	}
	return dollarQuoted(sql[i:])
}

// escapeString reports whether the string that starts at sql[i] is an E'...' string, in which a
// backslash escapes whatever the setting.
func escapeString(sql string, i int) bool {
	return i > 0 && (sql[i-1] == 'e' || sql[i-1] == 'E') && (i < 2 || !isIdent(sql[i-2]))
}

// lexSpecial marks the bytes significantEnd must look at: whitespace,
// semicolons and the starts of comments, strings and identifiers. A '$'
// after an identifier byte is ordinary (a$b), so the run loop stops on every
// '$' and the switch decides.
var lexSpecial = func() (t [256]bool) {
	for _, c := range []byte(" \t\n\r\f\v;-/'\"$") {
		t[c] = true
	}
	return t
}()

// quoted returns the length of the quoted token starting at sql[0] == q,
// where a doubled q stands for itself and, with escapes, a backslash escapes
// the next byte (E'...' strings).
func quoted(sql string, q byte, escapes bool) (int, bool) {
	for i := 1; i < len(sql); i++ {
		switch sql[i] {
		case '\\':
			if escapes {
				i++
			}
		case q:
			if i+1 < len(sql) && sql[i+1] == q {
				i++
				continue
			}
			return i + 1, true
		}
	}
	return len(sql), false
}

// dollarQuoted returns the length of the token starting with '$' at sql[0]:
// a dollar-quoted string ($tag$...$tag$), or else just the '$' (a parameter
// such as $1 continues as ordinary bytes).
func dollarQuoted(sql string) (int, bool) {
	j := 1
	for j < len(sql) && isIdent(sql[j]) && sql[j] != '$' {
		if j == 1 && sql[j] >= '0' && sql[j] <= '9' {
			return 1, true // $1: a parameter
		}
		j++
	}
	if j >= len(sql) || sql[j] != '$' {
		return 1, true
	}
	tag := sql[:j+1]
	k := strings.Index(sql[j+1:], tag)
	if k < 0 {
		return len(sql), false
	}
	return j + 1 + k + len(tag), true
}

// isSpace reports PostgreSQL's lexer whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// isIdent reports a byte that may continue an identifier (PostgreSQL allows
// '$' after the first byte, and any non-ASCII byte).
func isIdent(c byte) bool {
	return c == '_' || c == '$' || c >= 0x80 ||
		(c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}
