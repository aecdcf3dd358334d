package pattern

import (
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The require_where guard's rule: an UPDATE or DELETE (or a MERGE's ON and WHEN MATCHED
// conditions) passes only if its condition restricts the target table's rows: it references a
// column of the target in a way that can be false for some row, or it is proved never true.
// Everything else counts as unrestricted, whatever its form: constants, parameters, functions,
// casts and subqueries that do not reference the target are all the same to a row of it.
//
// The condition is read as a formula over atoms:
//   - AND restricts if any operand does; OR only if every operand does and no two operands are
//     complementary (x IS NULL OR x IS NOT NULL, p OR NOT p, x = 1 OR x <> 1); NOT swaps the
//     two (De Morgan), so NOT (id = 5 AND false) does not pass.
//   - An atom (a comparison, IS NULL, LIKE, IN, a function call, a boolean column, a CASE...)
//     restricts if it depends on a target column: a column of the target appears in it outside
//     any comparison of an expression with itself. Self-comparisons are told through casts,
//     collations and identity arithmetic (id = id, t.id = id, id + 0 = id, id::int = id::int,
//     (a, b) = (a, b), x - x = 0).
//   - A condition used as a value (a subquery's WHERE, (p) = true, an argument) depends on the
//     target when it restricts the target's rows as a WHERE would and is not provably never
//     true.
//   - A subquery depends on the target when it is correlated with it: EXISTS (SELECT 1 FROM u
//     WHERE u.id = t.uid) restricts, EXISTS (SELECT 1) does not, nor does EXISTS (SELECT 1
//     FROM u WHERE u.x = 1 OR t.id = 5), which holds for every row of t once some u.x is 1.
//     Names the subquery's own FROM introduces shadow the target's, and an unqualified column
//     inside a subquery with a FROM clause is taken to be the subquery's.
//   - A condition the constant folder proves never true (false, NULL, 1 = 0: what ORMs send for
//     an empty IN list) matches no row, so it passes.
//
// What it cannot see: an unqualified column at the top level is taken to be the target's (an
// UPDATE ... FROM or DELETE ... USING may mean another table's column); and a tautology built
// inside an opaque expression (a function, a CASE, COALESCE) is not proved. The guard stops
// mistakes, not someone who writes SQL to defeat it.

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

	restricted map[polarNode]bool
	depend     map[*pg.Node]bool
	canons     map[*pg.Node]string
	f          folder
}

type polarNode struct {
	n   *pg.Node
	neg bool
}

// scope is what a subquery's FROM clause makes visible.
type scope struct {
	names   []string // the names of its FROM items (aliases, or relation names)
	hasFrom bool
}

// restricts reports whether where restricts the rows of the target rel (see above). A missing
// condition does not.
func restricts(rel *pg.RangeVar, where *pg.Node) bool {
	if where == nil || where.Node == nil {
		return false
	}
	r := restrictor{t: newTarget(rel), restricted: map[polarNode]bool{}, depend: map[*pg.Node]bool{},
		canons: map[*pg.Node]string{}, f: folder{memo: map[*pg.Node]value{}}}
	return r.restrict(where, false)
}

// restrict reports whether the condition n (its negation when neg) restricts the target's rows.
func (r *restrictor) restrict(n *pg.Node, neg bool) bool {
	k := polarNode{n, neg}
	if v, ok := r.restricted[k]; ok {
		return v
	}
	v := r.restrictNode(n, neg)
	r.restricted[k] = v
	return v
}

func (r *restrictor) restrictNode(n *pg.Node, neg bool) bool {
	if t, ok := r.f.fold(n).asTruth(); ok {
		// Never true: matches no row. (NOT x is true exactly where x is false.)
		if !neg && t&tTrue == 0 || neg && t&tFalse == 0 {
			return true
		}
	}
	b, ok := n.Node.(*pg.Node_BoolExpr)
	if !ok {
		return r.depends(n)
	}
	e := b.BoolExpr
	switch e.Boolop {
	case pg.BoolExprType_NOT_EXPR:
		return len(e.Args) == 1 && r.restrict(e.Args[0], !neg)
	case pg.BoolExprType_AND_EXPR, pg.BoolExprType_OR_EXPR:
		if (e.Boolop == pg.BoolExprType_AND_EXPR) != neg {
			// A conjunction (AND, or NOT of an OR): one restricting operand is enough.
			for _, a := range e.Args {
				if r.restrict(a, neg) {
					return true
				}
			}
			return false
		}
		// A disjunction (OR, or NOT of an AND): every operand must restrict, and no pair may
		// cover every row between them.
		for _, a := range e.Args {
			if !r.restrict(a, neg) {
				return false
			}
		}
		return !r.complementary(e.Args)
	}
	return false
}

// depends reports whether the value of n depends on a column of the target (see above).
func (r *restrictor) depends(n *pg.Node) bool {
	if n == nil {
		return false
	}
	if v, ok := r.depend[n]; ok {
		return v
	}
	v := r.dependsNode(n)
	r.depend[n] = v
	return v
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
		return r.restrict(n, false) && !r.neverTrue(n)
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

// neverTrue reports whether the condition n is provably never true: folded so, a conjunction
// with such an operand, a disjunction of them, or a comparison of an expression with itself that
// cannot hold (x <> x, x < x, x IS DISTINCT FROM x).
func (r *restrictor) neverTrue(n *pg.Node) bool {
	if t, ok := r.f.fold(n).asTruth(); ok && t&tTrue == 0 {
		return true
	}
	switch x := n.Node.(type) {
	case *pg.Node_BoolExpr:
		switch x.BoolExpr.Boolop {
		case pg.BoolExprType_AND_EXPR:
			for _, a := range x.BoolExpr.Args {
				if r.neverTrue(a) {
					return true
				}
			}
		case pg.BoolExprType_OR_EXPR:
			for _, a := range x.BoolExpr.Args {
				if !r.neverTrue(a) {
					return false
				}
			}
			return len(x.BoolExpr.Args) > 0
		}
	case *pg.Node_AExpr:
		e := x.AExpr
		switch e.Kind {
		case pg.A_Expr_Kind_AEXPR_OP:
			switch opName(e) {
			case "<>", "!=", "<", ">":
				return r.same(e.Lexpr, e.Rexpr)
			}
		case pg.A_Expr_Kind_AEXPR_DISTINCT:
			return r.same(e.Lexpr, e.Rexpr)
		}
	}
	return false
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
	s, ok := n.GetNode().(*pg.Node_SelectStmt)
	if !ok {
		return n != nil && r.depends(n)
	}
	return r.selectStmtDepends(s.SelectStmt, exists)
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
		if s, ok := f.Node.(*pg.Node_String_); ok {
			parts = append(parts, s.String_.Sval)
		}
	}
	qual := parts
	if len(parts) == len(c.Fields) && len(parts) > 0 {
		qual = parts[:len(parts)-1] // the last part is the column, unless it is a *
	}
	if len(qual) == 0 {
		// Unqualified: the innermost FROM clause's, as far as we can tell without a schema.
		for _, s := range r.scopes {
			if s.hasFrom {
				return false
			}
		}
		return true
	}
	rel := qual[len(qual)-1]
	for _, s := range r.scopes {
		for _, name := range s.names {
			if name == rel {
				return false // shadowed by a subquery's own FROM item
			}
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
			if op == "*" && (r.isNum(e.Lexpr, 0) || r.isNum(e.Rexpr, 0)) {
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
		if l, ok := e.Rexpr.GetNode().(*pg.Node_List); ok {
			for _, item := range l.List.Items {
				if r.same(e.Lexpr, item) {
					return false // x IN (x, ...) holds wherever x is not null
				}
			}
		}
	case pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN,
		pg.A_Expr_Kind_AEXPR_BETWEEN_SYM, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
		if l, ok := e.Rexpr.GetNode().(*pg.Node_List); ok && len(l.List.Items) == 2 &&
			r.same(e.Lexpr, l.List.Items[0]) && r.same(e.Lexpr, l.List.Items[1]) {
			return false
		}
	}
	return r.depends(e.Lexpr) || r.depends(e.Rexpr)
}

// same reports whether a and b are the same expression of the row (see canon).
func (r *restrictor) same(a, b *pg.Node) bool {
	return a != nil && b != nil && r.canon(a) == r.canon(b)
}

// canon returns a canonical text of an expression: casts, collations, unary plus and identity
// arithmetic (+ 0, - 0, * 1, / 1) removed, target columns named without their qualifier, source
// positions left out. Two expressions with the same canonical text have the same value in every
// row (stripping a cast can only make more expressions the same, which blocks more, never less).
//
// The text is a 128-bit hash, so that a parent's text holds its children's in constant space: a
// collision could only make two expressions the same.
func (r *restrictor) canon(n *pg.Node) string {
	if n == nil || n.Node == nil {
		return "nil"
	}
	if c, ok := r.canons[n]; ok {
		return c
	}
	c := r.canonNode(n)
	r.canons[n] = c
	return c
}

// digest is the canonical text of a node whose own text is text.
func digest(text string) string {
	h := fnv.New128a()
	h.Write([]byte(text))
	return string(h.Sum(nil))
}

// canonNode computes canon(n).
func (r *restrictor) canonNode(n *pg.Node) string {
	switch x := n.Node.(type) {
	case *pg.Node_ColumnRef:
		var b strings.Builder
		fields := x.ColumnRef.Fields
		if r.isTarget(x.ColumnRef) && len(fields) > 0 {
			b.WriteString("T")
			fields = fields[len(fields)-1:]
		} else {
			b.WriteString("C")
		}
		for _, f := range fields {
			if s, ok := f.Node.(*pg.Node_String_); ok {
				b.WriteString("." + strconv.Quote(s.String_.Sval))
			} else {
				b.WriteString(".*")
			}
		}
		return digest(b.String())
	case *pg.Node_AConst:
		switch v := foldConst(x.AConst); v.k {
		case vNull:
			return digest("NULL")
		case vBool:
			return digest("B" + strconv.Itoa(int(v.b)))
		case vNum:
			return digest("N" + v.n.RatString())
		case vStr:
			return digest("S" + strconv.Quote(v.s))
		}
	case *pg.Node_TypeCast:
		return r.canon(x.TypeCast.Arg)
	case *pg.Node_CollateClause:
		return r.canon(x.CollateClause.Arg)
	case *pg.Node_AExpr:
		e := x.AExpr
		if e.Kind != pg.A_Expr_Kind_AEXPR_OP {
			break
		}
		op := opName(e)
		switch {
		case e.Lexpr == nil && op == "+":
			return r.canon(e.Rexpr)
		case e.Lexpr == nil:
		case (op == "+" || op == "-") && r.isNum(e.Rexpr, 0), (op == "*" || op == "/") && r.isNum(e.Rexpr, 1):
			return r.canon(e.Lexpr)
		case op == "+" && r.isNum(e.Lexpr, 0), op == "*" && r.isNum(e.Lexpr, 1):
			return r.canon(e.Rexpr)
		}
	case *pg.Node_SelectStmt:
		return r.canonSelect(x.SelectStmt)
	}
	return digest(r.generic(n.ProtoReflect()))
}

// generic is the canonical text of any node: its type and its fields but their positions.
func (r *restrictor) generic(m protoreflect.Message) string {
	var b strings.Builder
	b.WriteString(string(m.Descriptor().Name()))
	b.WriteByte('{')
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Name() == "location" || fd.Name() == "stmt_location" || fd.Name() == "stmt_len" {
			return true
		}
		b.WriteString(string(fd.Name()))
		b.WriteByte(':')
		if fd.IsList() {
			l := v.List()
			b.WriteByte('[')
			for i := 0; i < l.Len(); i++ {
				b.WriteString(r.canonValue(fd, l.Get(i)))
				b.WriteByte(',')
			}
			b.WriteByte(']')
		} else {
			b.WriteString(r.canonValue(fd, v))
		}
		b.WriteByte(';')
		return true
	})
	b.WriteByte('}')
	return b.String()
}

func (r *restrictor) canonValue(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	if fd.Message() == nil {
		if fd.Kind() == protoreflect.StringKind {
			return strconv.Quote(v.String())
		}
		return v.String()
	}
	switch x := v.Message().Interface().(type) {
	case *pg.Node:
		return r.canon(x)
	case *pg.SelectStmt:
		return r.canonSelect(x)
	}
	return digest(r.generic(v.Message()))
}

// canonSelect is the canonical text of a subquery, whose columns resolve in its own scope.
func (r *restrictor) canonSelect(s *pg.SelectStmt) string {
	if s == nil {
		return "nil"
	}
	r.enter(s)
	defer r.leave()
	return digest(r.generic(s.ProtoReflect()))
}

// isNum reports whether n folds to the number want.
func (r *restrictor) isNum(n *pg.Node, want int64) bool {
	v := r.f.fold(n)
	return v.k == vNum && v.n.IsInt() && v.n.Num().IsInt64() && v.n.Num().Int64() == want
}

// complementary reports whether two of args cover every row between them where their operands
// are not null: p and NOT p, x IS NULL and x IS NOT NULL, x IS TRUE and x IS NOT TRUE, x = y and
// x <> y, x < y and x >= y (either way round), x IS DISTINCT FROM y and x IS NOT DISTINCT FROM y.
// Each operand has canonical forms (what it is) and negations (what would complete it); a pair
// is a negation of one operand that is a form of another. Linear in the operands.
func (r *restrictor) complementary(args []*pg.Node) bool {
	forms := map[string]int{}
	for i, a := range args {
		for _, f := range r.forms(a, nil) {
			if _, dup := forms[f]; !dup {
				forms[f] = i
			}
		}
	}
	for i, a := range args {
		for _, f := range r.negations(a) {
			if j, ok := forms[f]; ok && j != i {
				return true
			}
		}
	}
	return false
}

// forms appends the canonical texts of the condition a: its own; for a comparison the same
// comparison with its operands swapped; for NOT b the negations of b.
func (r *restrictor) forms(a *pg.Node, dst []string) []string {
	dst = append(dst, r.canon(a))
	if b, ok := notArg(a); ok {
		return append(dst, r.negations(b)...)
	}
	if x, ok := a.Node.(*pg.Node_AExpr); ok {
		e := x.AExpr
		switch {
		case e.Kind == pg.A_Expr_Kind_AEXPR_OP && mirror[opName(e)] != "":
			dst = append(dst, r.cmp(mirror[opName(e)], e.Rexpr, e.Lexpr), r.cmp(opName(e), e.Lexpr, e.Rexpr))
		case e.Kind == pg.A_Expr_Kind_AEXPR_DISTINCT || e.Kind == pg.A_Expr_Kind_AEXPR_NOT_DISTINCT:
			dst = append(dst, r.cmp(e.Kind.String(), e.Lexpr, e.Rexpr), r.cmp(e.Kind.String(), e.Rexpr, e.Lexpr))
		}
	}
	return dst
}

// negations returns the canonical texts of the conditions that, ORed with a, cover every row.
func (r *restrictor) negations(a *pg.Node) []string {
	if x, ok := notArg(a); ok {
		return r.forms(x, nil)
	}
	neg := []string{"NOT" + r.canon(a)}
	switch x := a.Node.(type) {
	case *pg.Node_NullTest:
		t := x.NullTest
		opp := &pg.NullTest{Xpr: t.Xpr, Arg: t.Arg, Argisrow: t.Argisrow, Nulltesttype: pg.NullTestType_IS_NULL}
		if t.Nulltesttype == pg.NullTestType_IS_NULL {
			opp.Nulltesttype = pg.NullTestType_IS_NOT_NULL
		}
		neg = append(neg, r.canon(&pg.Node{Node: &pg.Node_NullTest{NullTest: opp}}))
	case *pg.Node_BooleanTest:
		b := x.BooleanTest
		if t := b.Booltesttype; t >= pg.BoolTestType_IS_TRUE && t <= pg.BoolTestType_IS_NOT_UNKNOWN {
			// IS X and IS NOT X are adjacent: 1-2, 3-4, 5-6.
			opp := &pg.BooleanTest{Xpr: b.Xpr, Arg: b.Arg, Booltesttype: t + 1}
			if t%2 == 0 {
				opp.Booltesttype = t - 1
			}
			neg = append(neg, r.canon(&pg.Node{Node: &pg.Node_BooleanTest{BooleanTest: opp}}))
		}
	case *pg.Node_AExpr:
		e := x.AExpr
		switch {
		case e.Kind == pg.A_Expr_Kind_AEXPR_OP && complement[opName(e)] != "":
			c := complement[opName(e)]
			neg = append(neg, r.cmp(c, e.Lexpr, e.Rexpr), r.cmp(mirror[c], e.Rexpr, e.Lexpr))
		case e.Kind == pg.A_Expr_Kind_AEXPR_DISTINCT:
			k := pg.A_Expr_Kind_AEXPR_NOT_DISTINCT.String()
			neg = append(neg, r.cmp(k, e.Lexpr, e.Rexpr), r.cmp(k, e.Rexpr, e.Lexpr))
		case e.Kind == pg.A_Expr_Kind_AEXPR_NOT_DISTINCT:
			k := pg.A_Expr_Kind_AEXPR_DISTINCT.String()
			neg = append(neg, r.cmp(k, e.Lexpr, e.Rexpr), r.cmp(k, e.Rexpr, e.Lexpr))
		}
	}
	return neg
}

// cmp is the canonical text of the comparison l op r.
func (r *restrictor) cmp(op string, l, rt *pg.Node) string {
	return "CMP" + op + "(" + r.canon(l) + "," + r.canon(rt) + ")"
}

// complement maps a comparison to its negation, mirror to the same comparison with its operands
// swapped.
var (
	complement = map[string]string{"=": "<>", "<>": "=", "!=": "=", "<": ">=", ">=": "<", ">": "<=", "<=": ">"}
	mirror     = map[string]string{"=": "=", "<>": "<>", "<": ">", ">": "<", "<=": ">=", ">=": "<="}
)

// notArg returns the operand of a NOT.
func notArg(n *pg.Node) (*pg.Node, bool) {
	if b, ok := n.Node.(*pg.Node_BoolExpr); ok && b.BoolExpr.Boolop == pg.BoolExprType_NOT_EXPR && len(b.BoolExpr.Args) == 1 {
		return b.BoolExpr.Args[0], true
	}
	return nil, false
}
