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
//   - The target's relation listed again (DELETE FROM t USING t AS t2, UPDATE t ... FROM t AS
//     t2, MERGE INTO t USING t AS s, a subquery's FROM t AS t2) ranges over every row of the
//     target, the written row itself included. A condition that restricts is read a second
//     time with each such item standing for the written row (selves): if it then holds for
//     every row, every row has a partner that satisfies it, itself, and every row is written
//     (t.email = t2.email, the de-duplication without its t.id > t2.id; EXISTS (SELECT 1 FROM t
//     AS t2 WHERE t2.id = t.id); id IN (SELECT id FROM t)). Only plain items of a FROM list
//     count: one in a join, or sampled, may not range over every row.

// target is the relation an UPDATE, DELETE or MERGE writes.
type target struct {
	qual    string // the name its columns are qualified with: its alias, or else its name
	rel     string
	schema  string
	catalog string
	aliased bool
	// selves are the names of the statement's own FROM items (UPDATE ... FROM, DELETE ...
	// USING, MERGE ... USING) that list the target's relation again.
	selves []string
}

func newTarget(r *pg.RangeVar, from []*pg.Node) target {
	if r == nil {
		return target{}
	}
	t := target{qual: r.Relname, rel: r.Relname, schema: r.Schemaname, catalog: r.Catalogname}
	if r.Alias != nil && r.Alias.Aliasname != "" {
		t.qual, t.aliased = r.Alias.Aliasname, true
	}
	t.selves = t.selvesIn(from)
	return t
}

// selvesIn returns the names of the plain items of the FROM list from that list the target's
// relation again, spelt alike (a schema named on one side only may be another table).
func (t target) selvesIn(from []*pg.Node) []string {
	var names []string
	for _, f := range from {
		v := f.GetRangeVar()
		if v != nil && v.Relname == t.rel && v.Schemaname == t.schema && v.Catalogname == t.catalog {
			names = fromNames(f, names)
		}
	}
	return names
}

// restrictor decides whether a write's condition restricts its target's rows. Single-use.
// Its results are memoised per node (a node's scope is fixed by its place in the tree), so a
// condition is judged in time linear in its size, however deeply its parts nest.
type restrictor struct {
	t      target
	scopes []scope // the subqueries entered, innermost last
	// selves: the target's relation listed again stands for the written row (the second
	// reading); metSelf: the first reading met such an item, so the second may differ.
	selves  bool
	metSelf bool

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
	selves  []string // those of its items that list the target's relation again
	hasFrom bool
	allSelf bool // its only FROM items list the target's relation again
}

// writeRestricts reports whether a write to rel, whose statement lists from besides (UPDATE
// ... FROM, DELETE ... USING, MERGE ... USING), restricts its target's rows: whether judge
// finds that it does, judge asking restricts of each condition it reads. When the conditions
// judge read list the target's relation again, judge reads them a second time, with those
// items standing for the written row (see above), and must find that it does then too.
func writeRestricts(rel *pg.RangeVar, from []*pg.Node, judge func(restricts func(where *pg.Node) bool) bool) bool {
	t := newTarget(rel, from)
	metSelf := false
	first := judge(func(where *pg.Node) bool {
		r := newRestrictor(t, false)
		ok := r.restrictsRows(where)
		metSelf = metSelf || r.metSelf
		return ok
	})
	if !first || !metSelf {
		return first
	}
	return judge(func(where *pg.Node) bool { return newRestrictor(t, true).restrictsRows(where) })
}

// restrictsRows reports whether where restricts the target's rows. A missing condition does
// not.
func (r *restrictor) restrictsRows(where *pg.Node) bool {
	return where.GetNode() != nil && r.restrict(where, false)
}

func newRestrictor(t target, selves bool) *restrictor {
	return &restrictor{t: t, selves: selves, restricted: map[polar]bool{}, never: map[polar]bool{},
		depend: map[*pg.Node]bool{}, canons: map[*pg.Node]string{}}
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
			if member, depends := r.selfMember(s); member {
				return depends
			}
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

// selfMember reports whether s, in the second reading (r.selves; the first notes that it met
// one), is x IN (SELECT e FROM t WHERE w) with t the target's relation listed again (alone in
// its FROM) and e the same expression as x, nothing grouped, limited or combined: for the
// written row, standing for t, it is then w, and depends reports whether w depends on the
// target.
func (r *restrictor) selfMember(s *pg.SubLink) (member, depends bool) {
	sel := s.Subselect.GetSelectStmt()
	if s.SubLinkType != pg.SubLinkType_ANY_SUBLINK || sel == nil || sel.Op != pg.SetOperation_SETOP_NONE ||
		len(sel.TargetList) != 1 || len(sel.GroupClause) > 0 || sel.HavingClause != nil ||
		sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.WindowClause) > 0 {
		return false, false
	}
	for _, n := range s.OperName { // none for IN, "=" for = ANY
		if n.GetString_().GetSval() != "=" {
			return false, false
		}
	}
	x := r.canon(s.Testexpr)
	r.enter(sel)
	defer r.leave()
	if !r.scopes[len(r.scopes)-1].allSelf || !r.self(true) || r.canon(sel.TargetList[0].GetResTarget().GetVal()) != x {
		return false, false
	}
	return true, r.anyChild(sel.ProtoReflect(), existsIgnores...)
}

// existsIgnores are the SelectStmt fields that cannot change whether a subquery has rows.
var existsIgnores = []protoreflect.Name{"target_list", "sort_clause", "group_clause", "distinct_clause",
	"window_clause", "locking_clause"}

// enter makes the subquery s the innermost scope; leave undoes it.
func (r *restrictor) enter(s *pg.SelectStmt) {
	sc := scope{hasFrom: len(s.FromClause) > 0, selves: r.t.selvesIn(s.FromClause)}
	for _, f := range s.FromClause {
		sc.names = fromNames(f, sc.names)
	}
	sc.allSelf = sc.hasFrom && len(sc.selves) == len(s.FromClause)
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

// isTarget reports whether a column reference names a column of the target: in the second
// reading (r.selves), a column of an item that lists the target's relation again too.
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
		for i := len(r.scopes) - 1; i >= 0; i-- {
			if s := r.scopes[i]; s.hasFrom {
				return r.self(s.allSelf)
			}
		}
		return true
	}
	rel := qual[len(qual)-1]
	for i := len(r.scopes) - 1; i >= 0; i-- {
		if s := r.scopes[i]; slices.Contains(s.names, rel) {
			// A subquery's own FROM item: another relation, or the target's listed again.
			return len(qual) == 1 && r.self(slices.Contains(s.selves, rel))
		}
	}
	t := r.t
	if len(qual) == 1 && slices.Contains(t.selves, rel) {
		return r.self(true)
	}
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

// self reports whether a column of an item that lists the target's relation again (listed)
// stands for the target's: only in the second reading. The first notes that it met one.
func (r *restrictor) self(listed bool) bool {
	if listed && !r.selves {
		r.metSelf = true
	}
	return listed && r.selves
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
		if a := e.Rexpr.GetAArrayExpr(); a != nil && e.Kind == pg.A_Expr_Kind_AEXPR_OP_ANY && opName(e) == "=" &&
			slices.ContainsFunc(a.Elements, func(item *pg.Node) bool { return r.same(e.Lexpr, item) }) {
			return false // x = ANY (ARRAY[x, ...]) holds wherever x is not null, as x IN (x, ...)
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
