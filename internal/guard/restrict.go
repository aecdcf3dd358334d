package guard

import (
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A condition is read as a formula over atoms (see the package documentation):
//   - AND restricts if any operand does; OR only if every operand does and no two operands are
//     complementary; NOT swaps the two (De Morgan).
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
	k := polar{n, neg}
	if v, ok := r.restricted[k]; ok {
		return v
	}
	v := r.restrictNode(n, neg)
	r.restricted[k] = v
	return v
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

// truth is the value of a condition that is the same for every row.
type truth uint8

const (
	tTrue truth = iota
	tFalse
	tNull
)

// neverTrue reports whether the condition n is never true or, when neg, never false (so that
// NOT n is never true). It proves this for literals ([constant]), for comparisons of an
// expression with itself (x <> x is never true, x = x never false), and through NOT, AND and
// OR. Anything else may be either.
func (r *restrictor) neverTrue(n *pg.Node, neg bool) bool {
	k := polar{n, neg}
	if v, ok := r.never[k]; ok {
		return v
	}
	v := r.neverTrueNode(n, neg)
	r.never[k] = v
	return v
}

func (r *restrictor) neverTrueNode(n *pg.Node, neg bool) bool {
	if v, ok := constant(n); ok {
		if neg {
			return v != tFalse
		}
		return v != tTrue
	}
	switch x := n.GetNode().(type) {
	case *pg.Node_BoolExpr:
		e := x.BoolExpr
		switch e.Boolop {
		case pg.BoolExprType_NOT_EXPR:
			return len(e.Args) == 1 && r.neverTrue(e.Args[0], !neg)
		case pg.BoolExprType_AND_EXPR, pg.BoolExprType_OR_EXPR:
			// Never true: an AND with such an operand, an OR of them all; never false: an AND
			// of such operands, an OR with one.
			one := (e.Boolop == pg.BoolExprType_AND_EXPR) != neg
			for _, a := range e.Args {
				if r.neverTrue(a, neg) == one {
					return one
				}
			}
			return !one && len(e.Args) > 0
		}
	case *pg.Node_AExpr:
		e := x.AExpr
		if !r.same(e.Lexpr, e.Rexpr) {
			return false
		}
		switch e.Kind {
		case pg.A_Expr_Kind_AEXPR_OP:
			switch opName(e) {
			case "<>", "!=", "<", ">": // false or null
				return !neg
			case "=", "<=", ">=": // true or null
				return neg
			}
		case pg.A_Expr_Kind_AEXPR_DISTINCT: // false
			return !neg
		case pg.A_Expr_Kind_AEXPR_NOT_DISTINCT: // true
			return neg
		}
	}
	return false
}

// constant evaluates a condition made only of literals: a boolean or NULL literal, or a
// comparison of two integer literals or (=, <>) two string literals. ok is false for anything
// else, which may be true or not.
func constant(n *pg.Node) (v truth, ok bool) {
	if c := n.GetAConst(); c != nil {
		if c.Isnull {
			return tNull, true
		}
		if b, ok := c.Val.(*pg.A_Const_Boolval); ok {
			return boolTruth(b.Boolval.Boolval), true
		}
		return 0, false
	}
	e := n.GetAExpr()
	if e == nil || e.Kind != pg.A_Expr_Kind_AEXPR_OP {
		return 0, false
	}
	l, r := e.Lexpr.GetAConst(), e.Rexpr.GetAConst()
	if l == nil || r == nil {
		return 0, false
	}
	op := opName(e)
	if _, cmp := complement[op]; !cmp {
		return 0, false
	}
	if l.Isnull || r.Isnull {
		return tNull, true
	}
	c, ok := compareLiterals(l, r, op == "=" || op == "<>" || op == "!=")
	if !ok {
		return 0, false
	}
	switch op {
	case "=":
		return boolTruth(c == 0), true
	case "<>", "!=":
		return boolTruth(c != 0), true
	case "<":
		return boolTruth(c < 0), true
	case ">":
		return boolTruth(c > 0), true
	case "<=":
		return boolTruth(c <= 0), true
	}
	return boolTruth(c >= 0), true // ">="
}

// compareLiterals compares two integer literals, or (when equality is all that is asked, since
// the order of strings depends on the collation) two string literals.
func compareLiterals(l, r *pg.A_Const, equality bool) (int, bool) {
	if a, b := l.GetIval(), r.GetIval(); a != nil && b != nil {
		return int(a.Ival) - int(b.Ival), true
	}
	if a, b := l.GetSval(), r.GetSval(); equality && a != nil && b != nil {
		return strings.Compare(a.Sval, b.Sval), true
	}
	return 0, false
}

func boolTruth(b bool) truth {
	if b {
		return tTrue
	}
	return tFalse
}

// depends reports whether the value of n depends on a column of the target.
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
			if op == "*" && (isInt(e.Lexpr, 0) || isInt(e.Rexpr, 0)) {
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

// opName returns the operator of an A_Expr: "=" or "pg_catalog.=" -> "=".
func opName(e *pg.A_Expr) string {
	switch len(e.Name) {
	case 1:
		return e.Name[0].GetString_().GetSval()
	case 2:
		if e.Name[0].GetString_().GetSval() == "pg_catalog" {
			return e.Name[1].GetString_().GetSval()
		}
	}
	return ""
}

// isInt reports whether n is the integer literal want, cast or not.
func isInt(n *pg.Node, want int32) bool {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().Arg
	}
	i := n.GetAConst().GetIval()
	return i != nil && i.Ival == want
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
	if n.GetNode() == nil {
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
			if s := f.GetString_(); s != nil {
				b.WriteString("." + strconv.Quote(s.Sval))
			} else {
				b.WriteString(".*")
			}
		}
		return digest(b.String())
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
		case (op == "+" || op == "-") && isInt(e.Rexpr, 0), (op == "*" || op == "/") && isInt(e.Rexpr, 1):
			return r.canon(e.Lexpr)
		case op == "+" && isInt(e.Lexpr, 0), op == "*" && isInt(e.Lexpr, 1):
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
	if e := a.GetAExpr(); e != nil {
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
	if b := n.GetBoolExpr(); b != nil && b.Boolop == pg.BoolExprType_NOT_EXPR && len(b.Args) == 1 {
		return b.Args[0], true
	}
	return nil, false
}
