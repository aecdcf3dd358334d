package guard

import (
	"slices"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A condition is read as a formula over atoms (see the package documentation):
//   - AND restricts if any operand does; OR only if every operand does and no two operands are
//     complementary; NOT swaps the two (De Morgan). The operands of an OR include those of the
//     ORs nested in it, so a OR (b OR c) is judged as a OR b OR c.
//   - An atom (a comparison, IS NULL, LIKE, IN, a function call, a boolean column, a CASE...)
//     restricts if it depends on a target column: a column of the target appears in it outside
//     any comparison of an expression with itself.
//   - A condition used as a value (a subquery's WHERE, (p) = true, an argument) depends on the
//     target when it restricts the target's rows as a WHERE would and is not never true.
//   - A subquery depends on the target when it is correlated with it: EXISTS (SELECT 1 FROM u
//     WHERE u.id = t.uid) does, EXISTS (SELECT 1) does not, nor does EXISTS (SELECT 1 FROM u
//     WHERE u.x = 1 OR t.id = 5), which holds for every row of t once some u.x is 1. An
//     unqualified column inside a subquery with a FROM clause is taken to be the subquery's.

// target is the relation an UPDATE, DELETE or MERGE writes.
type target struct {
	qual    string // the name its columns are qualified with: its alias, or else its name
	rel     string
	schema  string
	catalog string
	aliased bool
}

func newTarget(r *pg.RangeVar) target {
	if r == nil {
		return target{}
	}
	t := target{qual: r.Relname, rel: r.Relname, schema: r.Schemaname, catalog: r.Catalogname}
	if r.Alias != nil && r.Alias.Aliasname != "" {
		t.qual, t.aliased = r.Alias.Aliasname, true
	}
	return t
}

// restrictor decides whether a write's condition restricts its target's rows. Single-use.
// Its results are memoised per node (a node's scope is fixed by its place in the tree), so a
// condition is judged in time linear in its size, however deeply its parts nest.
type restrictor struct {
	t      target
	scopes []scope // the subqueries entered, innermost last

	restricted map[polar]bool
	never      map[polar]bool
	depend     map[*pg.Node]bool
	canons     map[*pg.Node]string
}

// memo returns m[k], computed by f and stored the first time it is asked for.
func memo[K comparable, V any](m map[K]V, k K, f func() V) V {
	if v, ok := m[k]; ok {
		return v
	}
	v := f()
	m[k] = v
	return v
}

// polar is a condition read as itself, or (neg) as its negation.
type polar struct {
	n   *pg.Node
	neg bool
}

// scope is what a subquery's FROM clause makes visible.
type scope struct {
	names   []string // the names of its FROM items (aliases, or relation names)
	hasFrom bool
}

// restricts reports whether where restricts the rows of the target rel. A missing condition
// does not.
func restricts(rel *pg.RangeVar, where *pg.Node) bool {
	if where.GetNode() == nil {
		return false
	}
	r := restrictor{t: newTarget(rel), restricted: map[polar]bool{}, never: map[polar]bool{},
		depend: map[*pg.Node]bool{}, canons: map[*pg.Node]string{}}
	return r.restrict(where, false)
}

// restrict reports whether the condition n (its negation when neg) restricts the target's rows.
func (r *restrictor) restrict(n *pg.Node, neg bool) bool {
	return memo(r.restricted, polar{n, neg}, func() bool { return r.restrictNode(n, neg) })
}

func (r *restrictor) restrictNode(n *pg.Node, neg bool) bool {
	if r.neverTrue(n, neg) {
		return true // matches no row
	}
	e := n.GetBoolExpr()
	if e == nil {
		return r.depends(n)
	}
	switch e.Boolop {
	case pg.BoolExprType_NOT_EXPR:
		return len(e.Args) == 1 && r.restrict(e.Args[0], !neg)
	case pg.BoolExprType_AND_EXPR, pg.BoolExprType_OR_EXPR:
		if (e.Boolop == pg.BoolExprType_AND_EXPR) != neg {
			// A conjunction (AND, or NOT of an OR): one restricting operand is enough.
			return slices.ContainsFunc(e.Args, func(a *pg.Node) bool { return r.restrict(a, neg) })
		}
		// A disjunction (OR, or NOT of an AND), read as one with the disjunctions nested in it:
		// every operand must restrict, and no pair may cover every row between them.
		ds := disjuncts(polar{n, neg}, nil)
		for _, d := range ds {
			if !d.group && !r.restrict(d.n, d.neg) {
				return false
			}
		}
		return !r.complementary(ds)
	}
	return false
}

// disjunct is an operand of a disjunction, or (group) a disjunction nested in it.
type disjunct struct {
	polar
	group bool
}

// disjuncts appends the operands of the disjunction p, read through the disjunctions and NOTs
// nested in it as PostgreSQL's parser does not: a OR (b OR NOT (c AND d)) has the operands a,
// b, NOT c and NOT d. The nested disjunctions are appended too, as groups, so that a pair is
// found however it is grouped (p OR NOT p where p is itself an OR). Each node is appended
// once, so a disjunction is read in time linear in its size, however deeply it nests.
func disjuncts(p polar, dst []disjunct) []disjunct {
	for _, a := range p.n.GetBoolExpr().GetArgs() {
		q := polar{a, p.neg}
		for x, ok := notArg(q.n); ok; x, ok = notArg(q.n) {
			q = polar{x, !q.neg}
		}
		if e := q.n.GetBoolExpr(); e != nil && e.Boolop != pg.BoolExprType_NOT_EXPR &&
			(e.Boolop == pg.BoolExprType_OR_EXPR) != q.neg {
			dst = disjuncts(q, append(dst, disjunct{q, true}))
		} else {
			dst = append(dst, disjunct{q, false})
		}
	}
	return dst
}

// depends reports whether the value of n depends on a column of the target.
func (r *restrictor) depends(n *pg.Node) bool {
	if n == nil {
		return false
	}
	return memo(r.depend, n, func() bool { return r.dependsNode(n) })
}

func (r *restrictor) dependsNode(n *pg.Node) bool {
	switch x := n.Node.(type) {
	case nil:
		return false
	case *pg.Node_ColumnRef:
		return r.isTarget(x.ColumnRef)
	case *pg.Node_AConst, *pg.Node_ParamRef, *pg.Node_SqlvalueFunction, *pg.Node_RangeVar:
		return false
	case *pg.Node_CurrentOfExpr:
		return true // WHERE CURRENT OF: the one row a cursor is on
	case *pg.Node_BoolExpr:
		// A condition used as a value ((p) = true, coalesce(p, ...), a subquery's WHERE): it
		// varies with the target's rows if it excludes some and can be true (restrict alone
		// also accepts a condition that is never true, and a constant is no dependency).
		return r.restrict(n, false) && !r.neverTrue(n, false)
	case *pg.Node_AExpr:
		return r.aexprDepends(x.AExpr)
	case *pg.Node_SubLink:
		s := x.SubLink
		switch s.SubLinkType {
		case pg.SubLinkType_EXISTS_SUBLINK:
			return r.selectDepends(s.Subselect, true)
		case pg.SubLinkType_ANY_SUBLINK, pg.SubLinkType_ALL_SUBLINK, pg.SubLinkType_ROWCOMPARE_SUBLINK:
			return r.depends(s.Testexpr) || r.selectDepends(s.Subselect, false)
		}
		return r.selectDepends(s.Subselect, false)
	case *pg.Node_SelectStmt:
		return r.selectDepends(n, false)
	}
	return r.anyChild(n.ProtoReflect())
}

// anyChild reports whether any expression under m depends on the target, skipping the fields
// named in skip.
func (r *restrictor) anyChild(m protoreflect.Message, skip ...protoreflect.Name) bool {
	found := false
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Message() == nil || slices.Contains(skip, fd.Name()) {
			return true
		}
		if fd.IsList() {
			l := v.List()
			for i := 0; i < l.Len() && !found; i++ {
				found = r.childDepends(l.Get(i).Message())
			}
		} else {
			found = r.childDepends(v.Message())
		}
		return !found
	})
	return found
}

func (r *restrictor) childDepends(m protoreflect.Message) bool {
	switch x := m.Interface().(type) {
	case *pg.Node:
		return r.depends(x)
	case *pg.SelectStmt: // the arms of a set operation
		return r.selectStmtDepends(x, false)
	case *pg.RangeVar:
		return false
	}
	return r.anyChild(m)
}

// selectDepends reports whether the subquery n is correlated with the target. For EXISTS only
// whether it has rows matters, not its output columns, their order, grouping or distinctness.
func (r *restrictor) selectDepends(n *pg.Node, exists bool) bool {
	s := n.GetSelectStmt()
	if s == nil {
		return r.depends(n)
	}
	return r.selectStmtDepends(s, exists)
}

func (r *restrictor) selectStmtDepends(s *pg.SelectStmt, exists bool) bool {
	if s == nil {
		return false
	}
	if s.Op != pg.SetOperation_SETOP_NONE {
		return r.selectStmtDepends(s.Larg, exists) || r.selectStmtDepends(s.Rarg, exists)
	}
	r.enter(s)
	defer r.leave()
	if exists {
		return r.anyChild(s.ProtoReflect(), existsIgnores...)
	}
	return r.anyChild(s.ProtoReflect())
}

// existsIgnores are the SelectStmt fields that cannot change whether a subquery has rows.
var existsIgnores = []protoreflect.Name{"target_list", "sort_clause", "group_clause", "distinct_clause",
	"window_clause", "locking_clause"}

// enter makes the subquery s the innermost scope; leave undoes it.
func (r *restrictor) enter(s *pg.SelectStmt) {
	sc := scope{hasFrom: len(s.FromClause) > 0}
	for _, f := range s.FromClause {
		sc.names = fromNames(f, sc.names)
	}
	r.scopes = append(r.scopes, sc)
}

func (r *restrictor) leave() { r.scopes = r.scopes[:len(r.scopes)-1] }

// fromNames appends the names a FROM item makes visible.
func fromNames(n *pg.Node, names []string) []string {
	alias := func(a *pg.Alias) []string {
		if a != nil && a.Aliasname != "" {
			return append(names, a.Aliasname)
		}
		return names
	}
	switch x := n.GetNode().(type) {
	case *pg.Node_RangeVar:
		if x.RangeVar.Alias != nil && x.RangeVar.Alias.Aliasname != "" {
			return append(names, x.RangeVar.Alias.Aliasname)
		}
		return append(names, x.RangeVar.Relname)
	case *pg.Node_RangeSubselect:
		return alias(x.RangeSubselect.Alias)
	case *pg.Node_RangeFunction:
		return alias(x.RangeFunction.Alias)
	case *pg.Node_RangeTableFunc:
		return alias(x.RangeTableFunc.Alias)
	case *pg.Node_RangeTableSample:
		return fromNames(x.RangeTableSample.Relation, names)
	case *pg.Node_JoinExpr:
		names = fromNames(x.JoinExpr.Larg, names)
		names = fromNames(x.JoinExpr.Rarg, names)
		return alias(x.JoinExpr.Alias)
	}
	return names
}

// isTarget reports whether a column reference names a column of the target.
func (r *restrictor) isTarget(c *pg.ColumnRef) bool {
	parts := make([]string, 0, len(c.Fields))
	for _, f := range c.Fields {
		if s := f.GetString_(); s != nil {
			parts = append(parts, s.Sval)
		}
	}
	qual := parts
	if len(parts) == len(c.Fields) && len(parts) > 0 {
		qual = parts[:len(parts)-1] // the last part is the column, unless it is a *
	}
	if len(qual) == 0 {
		// Unqualified: the innermost FROM clause's, as far as we can tell without a schema.
		return !slices.ContainsFunc(r.scopes, func(s scope) bool { return s.hasFrom })
	}
	rel := qual[len(qual)-1]
	for _, s := range r.scopes {
		if slices.Contains(s.names, rel) {
			return false // shadowed by a subquery's own FROM item
		}
	}
	t := r.t
	switch len(qual) {
	case 1:
		return rel == t.qual
	case 2:
		return !t.aliased && rel == t.rel && (t.schema == "" || qual[0] == t.schema)
	case 3:
		return !t.aliased && rel == t.rel && (t.schema == "" || qual[1] == t.schema) &&
			(t.catalog == "" || qual[0] == t.catalog)
	}
	return false
}

// selfConstant are the operators whose result is the same for every row when both operands are
// the same expression: comparisons, pattern matches, containment and overlap, subtraction,
// division, remainder and exclusive or.
var selfConstant = map[string]bool{
	"=": true, "<>": true, "!=": true, "<": true, ">": true, "<=": true, ">=": true,
	"~~": true, "~~*": true, "!~~": true, "!~~*": true, "~": true, "~*": true, "!~": true, "!~*": true,
	"@>": true, "<@": true, "&&": true, "-": true, "/": true, "%": true, "#": true,
}

func (r *restrictor) aexprDepends(e *pg.A_Expr) bool {
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_OP:
		op := opName(e)
		if e.Lexpr != nil && e.Rexpr != nil {
			if selfConstant[op] && r.same(e.Lexpr, e.Rexpr) {
				return false
			}
			if op == "*" && (isNum(e.Lexpr, "0") || isNum(e.Rexpr, "0")) {
				return false
			}
		}
	case pg.A_Expr_Kind_AEXPR_OP_ANY, pg.A_Expr_Kind_AEXPR_OP_ALL, pg.A_Expr_Kind_AEXPR_DISTINCT,
		pg.A_Expr_Kind_AEXPR_NOT_DISTINCT, pg.A_Expr_Kind_AEXPR_NULLIF, pg.A_Expr_Kind_AEXPR_LIKE,
		pg.A_Expr_Kind_AEXPR_ILIKE, pg.A_Expr_Kind_AEXPR_SIMILAR:
		if r.same(e.Lexpr, e.Rexpr) {
			return false
		}
	case pg.A_Expr_Kind_AEXPR_IN:
		if l := e.Rexpr.GetList(); l != nil {
			if slices.ContainsFunc(l.Items, func(item *pg.Node) bool { return r.same(e.Lexpr, item) }) {
				return false // x IN (x, ...) holds wherever x is not null
			}
		}
	case pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN,
		pg.A_Expr_Kind_AEXPR_BETWEEN_SYM, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
		if l := e.Rexpr.GetList(); l != nil && len(l.Items) == 2 &&
			r.same(e.Lexpr, l.Items[0]) && r.same(e.Lexpr, l.Items[1]) {
			return false
		}
	}
	return r.depends(e.Lexpr) || r.depends(e.Rexpr)
}
