package pattern

import pg "github.com/pganalyze/pg_query_go/v5"

// maxNesting is how deep a text may nest, as [nesting] counts, for analyze to give it to
// pg_query; a deeper one is unparsable. pg_query's C code (the parse tree's output,
// normalisation) recurses once or more per level of the tree on the thread's stack, unchecked:
// a deep enough text kills the process with SIGSEGV, which no recover catches. The bound sits
// well below the depths that do it on glibc's thread stacks, 8 MiB and the 2 MiB of `ulimit -s
// unlimited` (measured in integration/PERFORMANCE.md, "How deep a text pg_query is given"), and
// little is lost: the server itself refuses a chain of operators a few times longer (stack
// depth limit exceeded, under its default max_stack_depth).
const maxNesting = 1000

// parsableDepth reports whether sql nests no deeper than maxNesting, so that pg_query can be
// given it. Each level counted takes a byte at least, so a shorter text is not scanned. A text
// the scanner rejects is left to the parser, which rejects it too, without walking a tree.
func parsableDepth(sql string) bool {
	if len(sql) <= maxNesting {
		return true
	}
	scan, err := pg.Scan(sql)
	return err != nil || nesting(scan.Tokens) <= maxNesting
}

// level is one parenthesis, bracket or CASE being read by nesting, and the text outside them
// all. An operand is what a list or boolean separator (comma, AND, OR, WHEN, THEN, ELSE)
// delimits: its operators chain into a left-deep tree, while separated operands are siblings
// (PostgreSQL's parser flattens AND and OR into one list). The zero value is a level just
// opened.
type level struct {
	chain   int  // operators in the current operand
	inner   int  // deepest level closed in the current operand
	deepest int  // deepest operand done
	shared  int  // set operations and joins, whose trees nest across separators
	done    int  // deepest statement done, before the last semicolon
	between int  // BETWEENs whose AND is still to come: it separates nothing
	isCase  bool // a CASE, ended by END
}

// depth is how deep l nests so far.
func (l *level) depth() int {
	return max(l.done, max(l.deepest, l.chain+l.inner)+l.shared)
}

// nesting returns an upper bound, up to a constant factor, of how deep pg_query's parse tree
// of the scanned tokens nests: the operators chained in an operand (prefix ones too, and NOT),
// plus the set operations and joins of its level, plus its levels of parentheses, brackets and
// CASE. Operators within a list (a VALUES row, an IN list, a select list) or an AND or OR
// chain are not added up, so a bulk INSERT or a long OR of comparisons counts little. It stops
// reading once more than maxNesting levels are open.
func nesting(tokens []*pg.ScanToken) int {
	stack := []level{{}}
	for _, t := range tokens {
		l := &stack[len(stack)-1]
		switch t.Token {
		case pg.Token_ASCII_40, pg.Token_ASCII_91, pg.Token_CASE: // ( [
			stack = append(stack, level{isCase: t.Token == pg.Token_CASE})
			if len(stack) > maxNesting+1 {
				return len(stack) - 1 // as deep at least, whatever follows
			}
		case pg.Token_ASCII_41, pg.Token_ASCII_93, pg.Token_END_P: // ) ]
			if len(stack) > 1 && (t.Token != pg.Token_END_P || l.isCase) {
				stack = pop(stack)
			} // else the END of a transaction, or text the parser rejects
		case pg.Token_AND:
			if l.between > 0 {
				l.between--
			} else {
				l.separate()
			}
		case pg.Token_ASCII_44, pg.Token_OR, pg.Token_WHEN, pg.Token_THEN, pg.Token_ELSE: // ,
			l.separate()
		case pg.Token_ASCII_59: // ;
			*l = level{done: l.depth(), isCase: l.isCase}
		case pg.Token_UNION, pg.Token_INTERSECT, pg.Token_EXCEPT, pg.Token_JOIN:
			l.shared++
		case pg.Token_BETWEEN:
			l.between++
			l.chain++
		default:
			if operator(t.Token) {
				l.chain++
			}
		}
	}
	for len(stack) > 1 { // unclosed: the parser rejects the text, but count it all the same
		stack = pop(stack)
	}
	return stack[0].depth()
}

// pop closes the innermost level of stack, one level deeper than its deepest operand, into the
// operand around it.
func pop(stack []level) []level {
	d := stack[len(stack)-1].depth() + 1
	stack = stack[:len(stack)-1]
	l := &stack[len(stack)-1]
	l.inner = max(l.inner, d)
	return stack
}

// separate ends l's current operand.
func (l *level) separate() {
	l.deepest = max(l.deepest, l.chain+l.inner)
	l.chain, l.inner = 0, 0
}

// operator reports the tokens that may nest an expression one level deeper: binary, prefix and
// postfix operators, casts, and the keywords of IS, LIKE, IN, BETWEEN, AT TIME ZONE, COLLATE and
// NOT.
func operator(t pg.Token) bool {
	switch t {
	case pg.Token_ASCII_37, pg.Token_ASCII_42, pg.Token_ASCII_43, pg.Token_ASCII_45, pg.Token_ASCII_47, // % * + - /
		pg.Token_ASCII_60, pg.Token_ASCII_61, pg.Token_ASCII_62, pg.Token_ASCII_94, // < = > ^
		pg.Token_Op, pg.Token_OPERATOR, pg.Token_TYPECAST, pg.Token_LESS_EQUALS, pg.Token_GREATER_EQUALS,
		pg.Token_NOT_EQUALS, pg.Token_IS, pg.Token_ISNULL, pg.Token_NOTNULL, pg.Token_LIKE, pg.Token_ILIKE,
		pg.Token_SIMILAR, pg.Token_IN_P, pg.Token_AT, pg.Token_COLLATE, pg.Token_OVERLAPS, pg.Token_NOT:
		return true
	}
	return false
}
