package guard

import (
	"hash/fnv"
	"slices"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"
)

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

// isNum reports whether n is the number want (0 or 1), written as an integer or a decimal, cast
// or not.
func isNum(n *pg.Node, want string) bool {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().Arg
	}
	l, ok := literal(n)
	return ok && l.num && l.s == want
}

// same reports whether a and b may be the same expression of the row (see canon). It answers
// "does a condition depend on the target?": taking two expressions for the same makes a
// comparison of them constant, which blocks more, never less. It is too loose for proving a
// condition never true, which admits more: for that, see identical.
func (r *restrictor) same(a, b *pg.Node) bool {
	return a != nil && b != nil && r.canon(a) == r.canon(b)
}

// identical reports whether a and b certainly have the same value in a row: the same column,
// parameter or literal. It answers "is a condition never true?" (x <> x). Nothing else is
// identical, not even to itself: a function may be volatile (random() <> random()) and a cast
// may lose what tells two values apart (0.5 <> 0.5::int).
func (r *restrictor) identical(a, b *pg.Node) bool {
	return plain(a) && plain(b) && r.same(a, b)
}

// plain reports whether n is a column, a parameter or a literal whose value is known
// ([literal]): an expression whose canonical text strips nothing.
func plain(n *pg.Node) bool {
	switch n.GetNode().(type) {
	case *pg.Node_ColumnRef, *pg.Node_ParamRef:
		return true
	case *pg.Node_AConst:
		_, ok := literal(n)
		return ok
	}
	return false
}

// canon returns a canonical text of an expression: casts, collations, unary plus and identity
// arithmetic (+ 0, - 0, * 1, / 1) removed, target columns named without their qualifier, numbers
// by their value (1 and 1.0), source positions left out. Two expressions with the same canonical
// text are alike but for what was removed, and calls with the same arguments may still differ
// (random()): alike enough to judge dependence ([same]), not proof of equal values ([identical]).
//
// The text is a 128-bit hash, so that a parent's text holds its children's in constant space: a
// collision could only make two expressions the same.
func (r *restrictor) canon(n *pg.Node) string {
	if n.GetNode() == nil {
		return "nil"
	}
	return memo(r.canons, n, func() string { return r.canonNode(n) })
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
		return r.canonColumn(x.ColumnRef)
	case *pg.Node_AConst:
		if l, ok := literal(n); ok && l.num {
			return digest("N" + l.s) // 1 and 1.0 are the same number
		}
	case *pg.Node_TypeCast:
		return r.canon(x.TypeCast.Arg)
	case *pg.Node_CollateClause:
		return r.canon(x.CollateClause.Arg)
	case *pg.Node_AExpr:
		if operand := identityOperand(x.AExpr); operand != nil {
			return r.canon(operand)
		}
	case *pg.Node_SelectStmt:
		return r.canonSelect(x.SelectStmt)
	case *pg.Node_SubLink:
		if v := scalarOf(x.SubLink); v != nil {
			return r.canon(v) // (SELECT x) is x
		}
	}
	return digest(r.generic(n.ProtoReflect()))
}

// canonColumn is the canonical text of a column reference: a column of the target's by its
// name alone, however qualified.
func (r *restrictor) canonColumn(c *pg.ColumnRef) string {
	var b strings.Builder
	fields := c.Fields
	if r.isTarget(c) && len(fields) > 0 {
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
}

// identityOperand is the operand that an identity operation leaves as it is (+x, -(-x), x + 0,
// x - 0, x * 1, x / 1, 0 + x, 1 * x), nil for any other operation.
func identityOperand(e *pg.A_Expr) *pg.Node {
	if e.Kind != pg.A_Expr_Kind_AEXPR_OP {
		return nil
	}
	op := opName(e)
	switch {
	case e.Lexpr == nil && op == "+":
		return e.Rexpr
	case e.Lexpr == nil && op == "-":
		if inner := e.Rexpr.GetAExpr(); inner != nil && inner.Kind == pg.A_Expr_Kind_AEXPR_OP &&
			inner.Lexpr == nil && opName(inner) == "-" {
			return inner.Rexpr
		}
	case e.Lexpr == nil:
	case (op == "+" || op == "-") && isNum(e.Rexpr, "0"), (op == "*" || op == "/") && isNum(e.Rexpr, "1"):
		return e.Lexpr
	case op == "+" && isNum(e.Lexpr, "0"), op == "*" && isNum(e.Lexpr, "1"):
		return e.Rexpr
	}
	return nil
}

// scalarOf is the expression of a scalar subquery that only selects it, (SELECT x): no FROM,
// no condition, no set operation, one column; nil for any other sublink. Its columns, with no
// FROM of the subquery's own, are those of the scope around it.
func scalarOf(s *pg.SubLink) *pg.Node {
	sel := s.Subselect.GetSelectStmt()
	if s.SubLinkType != pg.SubLinkType_EXPR_SUBLINK || sel == nil || sel.Op != pg.SetOperation_SETOP_NONE ||
		len(sel.FromClause) > 0 || sel.WhereClause != nil || sel.HavingClause != nil || len(sel.GroupClause) > 0 ||
		sel.LimitCount != nil || sel.LimitOffset != nil || len(sel.ValuesLists) > 0 || len(sel.TargetList) != 1 {
		return nil
	}
	return sel.TargetList[0].GetResTarget().GetVal()
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

// complementary reports whether the disjuncts ds cover every row between them where their
// operands are not null. Two do when one is the other's negation: p and NOT p, x IS NULL and x
// IS NOT NULL, x IS TRUE and x IS NOT TRUE, x = y and x <> y, x < y and x >= y (either way
// round), x IS DISTINCT FROM y and x IS NOT DISTINCT FROM y (or x = y), x IN (…) and x NOT IN
// (…) (a list of one as = and <>), LIKE and NOT LIKE (ILIKE, SIMILAR TO alike), BETWEEN and NOT
// BETWEEN, x = ANY (a) and x <> ALL (a). So does a conjunction beside the negation of each of
// its operands: (p AND q) OR NOT p OR NOT q, and NOT (p OR q) OR p OR q, the form p OR NOT p
// takes when p is a disjunction written first, which PostgreSQL's parser flattens into the
// outer one. Each disjunct has canonical forms (what it is) and negations (what would complete
// it); a pair is a negation of one disjunct that is a form of another. Linear in the disjuncts
// and their conjunctions' operands.
func (r *restrictor) complementary(ds []disjunct) bool {
	forms := map[string]int{} // the disjunct of each form; -1 when several have it
	for i, d := range ds {
		for _, f := range r.polarForms(d.polar, false) {
			if j, dup := forms[f]; !dup {
				forms[f] = i
			} else if j != i {
				forms[f] = -1
			}
		}
	}
	// completed reports whether a disjunct other than the i-th is a negation of p.
	completed := func(p polar, i int) bool {
		for _, f := range r.polarForms(p, true) {
			if j, ok := forms[f]; ok && j != i {
				return true
			}
		}
		return false
	}
	for i, d := range ds {
		if completed(d.polar, i) {
			return true
		}
	}
	for i, d := range ds {
		if cs := conjuncts(d.polar); len(cs) > 0 && !slices.ContainsFunc(cs, func(c polar) bool { return !completed(c, i) }) {
			return true
		}
	}
	return false
}

// conjuncts returns the operands of p when it is a conjunction (an AND, or NOT of an OR, whose
// operands are then negated), else nil.
func conjuncts(p polar) []polar {
	e := p.n.GetBoolExpr()
	if e == nil || e.Boolop == pg.BoolExprType_NOT_EXPR || (e.Boolop == pg.BoolExprType_AND_EXPR) == p.neg {
		return nil
	}
	cs := make([]polar, len(e.Args))
	for i, a := range e.Args {
		cs[i] = polar{a, p.neg}
	}
	return cs
}

// polarForms returns the forms of p (see complementary) or, when negations, its negations.
func (r *restrictor) polarForms(p polar, negations bool) []string {
	if p.neg != negations {
		return r.negations(p.n)
	}
	return r.forms(p.n, nil)
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
		case paired(e):
			dst = append(dst, r.cmp(e.Kind.String()+pairedOp(e), e.Lexpr, e.Rexpr))
			if v, ok := single(e); ok && mirror[opName(e)] != "" { // x IN (v): x = v
				dst = append(dst, r.cmp(opName(e), e.Lexpr, v), r.cmp(mirror[opName(e)], v, e.Lexpr))
			}
		}
	}
	return dst
}

// paired reports whether e has a complement of its own shape (pairedComplement).
func paired(e *pg.A_Expr) bool {
	_, _, ok := pairedComplement(e.Kind, pairedOp(e))
	return ok
}

// pairedComplement is the kind and operator of the A_Expr that, ORed with one of kind k and
// operator op, covers every row: NOT IN for IN (<> for =), NOT LIKE for LIKE, NOT BETWEEN for
// BETWEEN, <> ALL for = ANY; ok is false where there is none.
func pairedComplement(k pg.A_Expr_Kind, op string) (pg.A_Expr_Kind, string, bool) {
	switch k {
	case pg.A_Expr_Kind_AEXPR_IN, pg.A_Expr_Kind_AEXPR_LIKE, pg.A_Expr_Kind_AEXPR_ILIKE, pg.A_Expr_Kind_AEXPR_SIMILAR:
		c, ok := negatedOp[op]
		return k, c, ok
	case pg.A_Expr_Kind_AEXPR_OP_ANY:
		c, ok := complement[op]
		return pg.A_Expr_Kind_AEXPR_OP_ALL, c, ok
	case pg.A_Expr_Kind_AEXPR_OP_ALL:
		c, ok := complement[op]
		return pg.A_Expr_Kind_AEXPR_OP_ANY, c, ok
	case pg.A_Expr_Kind_AEXPR_BETWEEN:
		return pg.A_Expr_Kind_AEXPR_NOT_BETWEEN, op, true
	case pg.A_Expr_Kind_AEXPR_NOT_BETWEEN:
		return pg.A_Expr_Kind_AEXPR_BETWEEN, op, true
	case pg.A_Expr_Kind_AEXPR_BETWEEN_SYM:
		return pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM, op, true
	case pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
		return pg.A_Expr_Kind_AEXPR_BETWEEN_SYM, op, true
	}
	return k, "", false
}

// pairedOp is the operator of e that its paired forms name: none for BETWEEN, whose kind says
// all (its name is the keyword).
func pairedOp(e *pg.A_Expr) string {
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN, pg.A_Expr_Kind_AEXPR_BETWEEN_SYM,
		pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
		return ""
	}
	return opName(e)
}

// negatedOp maps the operator of IN, LIKE, ILIKE and SIMILAR TO to their NOT forms' and back.
var negatedOp = map[string]string{"=": "<>", "<>": "=", "~~": "!~~", "!~~": "~~", "~~*": "!~~*", "!~~*": "~~*", "~": "!~", "!~": "~"}

// single returns the one value of x IN (v), x NOT IN (v).
func single(e *pg.A_Expr) (*pg.Node, bool) {
	if e.Kind != pg.A_Expr_Kind_AEXPR_IN {
		return nil, false
	}
	if l := e.Rexpr.GetList(); l != nil && len(l.Items) == 1 {
		return l.Items[0], true
	}
	return nil, false
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
			if opName(e) == "=" { // x = y OR x IS DISTINCT FROM y
				k := pg.A_Expr_Kind_AEXPR_DISTINCT.String()
				neg = append(neg, r.cmp(k, e.Lexpr, e.Rexpr), r.cmp(k, e.Rexpr, e.Lexpr))
			}
		case paired(e):
			k, c, _ := pairedComplement(e.Kind, pairedOp(e))
			neg = append(neg, r.cmp(k.String()+c, e.Lexpr, e.Rexpr))
			if v, ok := single(e); ok && complement[opName(e)] != "" { // x IN (v) OR x <> v
				cc := complement[opName(e)]
				neg = append(neg, r.cmp(cc, e.Lexpr, v), r.cmp(mirror[cc], v, e.Lexpr))
			}
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
