package guard

import (
	"slices"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Facts are the guard facts of one statement text. The zero value is a text that writes
// safely or not at all.
type Facts struct {
	// UnsafeWrite reports an UPDATE, DELETE or MERGE that does not restrict its target's rows
	// (see the package documentation); for unparsed text, one that may hold such a write.
	UnsafeWrite bool
	// Truncate reports a TRUNCATE anywhere in the text; for unparsed text, that it may hold one.
	Truncate bool
}

// Check returns the guard facts of a parsed text.
func Check(tree *pg.ParseResult) Facts {
	var w walker
	for _, s := range tree.GetStmts() {
		w.visit(s.GetStmt().ProtoReflect())
	}
	return w.facts
}

// walker visits a parse tree and collects its facts. Single-use.
type walker struct {
	facts  Facts
	noExec int // >0 inside text that defines a statement without running it
}

func (w *walker) visit(m protoreflect.Message) {
	switch x := m.Interface().(type) {
	case *pg.UpdateStmt:
		w.write(restricts(x.Relation, x.FromClause, x.WhereClause))
	case *pg.DeleteStmt:
		w.write(restricts(x.Relation, x.UsingClause, x.WhereClause))
	case *pg.MergeStmt:
		w.write(writeRestricts(x.Relation, []*pg.Node{x.SourceRelation}, func(restricts func(*pg.Node) bool) bool {
			return mergeRestricts(x, restricts)
		}))
	case *pg.TruncateStmt:
		w.facts.Truncate = true
	case *pg.ExplainStmt:
		// Plain EXPLAIN plans without executing; EXPLAIN ANALYZE runs it.
		if !explainAnalyze(x.Options) {
			w.noExec++
			defer func() { w.noExec-- }()
		}
	case *pg.RuleStmt, *pg.CreateFunctionStmt, *pg.ViewStmt:
		// A rule action, a function body or a view is defined, not run. (PREPARE does count: the
		// guard cannot see what a later EXECUTE runs.)
		w.noExec++
		defer func() { w.noExec-- }()
	}
	EachChild(m, w.visit)
}

// EachChild calls visit with each message that a message-typed field of m holds, a list's in
// order, but for the fields named in skip: one step of a walk down a parse tree.
func EachChild(m protoreflect.Message, visit func(protoreflect.Message), skip ...protoreflect.Name) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || slices.Contains(skip, fd.Name()) {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				visit(l.Get(i).Message())
			}
			return true
		}
		visit(v.Message())
		return true
	})
}

// write records an executed write that restricts its target's rows or does not.
func (w *walker) write(restricted bool) {
	if w.noExec == 0 && !restricted {
		w.facts.UnsafeWrite = true
	}
}

// restricts reports whether the WHERE clause where of an UPDATE or DELETE of rel, whose
// statement lists from besides, restricts its target's rows.
func restricts(rel *pg.RangeVar, from []*pg.Node, where *pg.Node) bool {
	return writeRestricts(rel, from, func(restricts func(*pg.Node) bool) bool { return restricts(where) })
}

// mergeRestricts reports whether a MERGE's ON condition restricts the target's rows, or else
// its WHEN MATCHED ... UPDATE/DELETE clauses do between them: each has a condition and the OR
// of their conditions restricts (an UPDATE of the rows where x IS NULL and a DELETE of those
// where x IS NOT NULL write every row). restricts judges one condition (writeRestricts).
func mergeRestricts(s *pg.MergeStmt, restricts func(*pg.Node) bool) bool {
	if restricts(s.JoinCondition) {
		return true
	}
	var conds []*pg.Node
	for _, c := range s.MergeWhenClauses {
		wc := c.GetMergeWhenClause()
		if wc == nil || !wc.Matched {
			continue
		}
		if ct := wc.CommandType; ct != pg.CmdType_CMD_UPDATE && ct != pg.CmdType_CMD_DELETE {
			continue
		}
		if wc.Condition.GetNode() == nil {
			return false
		}
		conds = append(conds, wc.Condition)
	}
	if len(conds) == 0 {
		return true // it writes no row of the target
	}
	return restricts(pg.MakeBoolExprNode(pg.BoolExprType_OR_EXPR, conds, -1))
}

// explainAnalyze reports whether EXPLAIN options run the statement. As PostgreSQL reads a
// boolean option, only false, off and 0 turn ANALYZE off; anything else counts as on.
func explainAnalyze(opts []*pg.Node) bool {
	on := false
	for _, o := range opts {
		d := o.GetDefElem()
		if d == nil || d.Defname != "analyze" {
			continue
		}
		switch a := d.Arg.GetNode().(type) {
		case *pg.Node_Boolean:
			on = a.Boolean.Boolval
		case *pg.Node_String_:
			on = !strings.EqualFold(a.String_.Sval, "false") && !strings.EqualFold(a.String_.Sval, "off")
		case *pg.Node_Integer:
			on = a.Integer.Ival != 0
		default:
			on = true
		}
	}
	return on
}

// Unparsed returns the guard facts of a text pg_query cannot parse, or may read otherwise than
// the server. The server may still run it (its parser is newer, or standard_conforming_strings
// is off, where a backslash escapes a quote and pg_query sees the string end elsewhere). Without a parse tree a keyword cannot be
// told from a word in a string or a quoted identifier, so it errs towards yes: any UPDATE,
// DELETE or MERGE counts as an unsafe write, except UPDATE after FOR, KEY or DO (SELECT ... FOR
// [NO KEY] UPDATE, ON CONFLICT DO UPDATE), which writes no rows of its own, and only where
// nothing but whitespace separates the two words (a quote, a comment or a semicolon between
// them may end a string the FOR was in), and the FOR is not the last word of a line after
// "--" (a line comment's, which the newline ends); any TRUNCATE counts.
func Unparsed(text string) Facts {
	var f Facts
	prev := ""
	dashes := false // "--" since the last newline: its words may be a comment's
	for i := 0; i < len(text); {
		if !isWordStart(text[i]) {
			switch {
			case text[i] == '\n' || text[i] == '\r':
				if dashes {
					prev, dashes = "", false
				}
			case text[i] == '-' && i+1 < len(text) && text[i+1] == '-':
				dashes = true
				prev = ""
			case !isSpace(text[i]):
				prev = ""
			}
			i++
			continue
		}
		j := i + 1
		for j < len(text) && (isWordStart(text[j]) || text[j] >= '0' && text[j] <= '9' || text[j] == '$') {
			j++
		}
		word := text[i:j]
		switch {
		case strings.EqualFold(word, "delete"), strings.EqualFold(word, "merge"):
			f.UnsafeWrite = true
		case strings.EqualFold(word, "update"):
			if !strings.EqualFold(prev, "for") && !strings.EqualFold(prev, "do") && !strings.EqualFold(prev, "key") {
				f.UnsafeWrite = true
			}
		case strings.EqualFold(word, "truncate"):
			f.Truncate = true
		}
		prev, i = word, j
	}
	return f
}

func isWordStart(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '_' || c >= 0x80
}

// isSpace reports whether c is whitespace to PostgreSQL's lexer.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}
