package pattern

import (
	"math/big"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
)

// truth is the set of SQL truth values an expression may take: a sound
// over-approximation, so "true is not in the set" is a proof that no row
// matches it. Unknown expressions take all three values.
type truth uint8

const (
	tTrue truth = 1 << iota
	tFalse
	tNull
	tAny = tTrue | tFalse | tNull
)

// valKind classifies a folded expression.
type valKind uint8

const (
	vUnknown valKind = iota // not a constant: a column, a parameter, a function...
	vNull                   // a NULL constant of any type
	vBool                   // a boolean; b holds its possible values (never only tNull)
	vNum                    // an exact number in n
	vStr                    // a string constant (unknown-typed literal or text)
	vCol                    // a bare column reference; col holds its dotted name
)

// value is a folded expression.
type value struct {
	k   valKind
	b   truth
	n   *big.Rat
	s   string
	col string
}

var unknown = value{k: vUnknown}

// asTruth converts v to a truth set as a boolean context (WHERE, AND, OR,
// NOT) would: an unknown-typed string literal is read by boolin, NULL is
// tNull, anything else is unknown. ok is false when v cannot be a boolean
// (PostgreSQL would reject the statement).
func (v value) asTruth() (truth, bool) {
	switch v.k {
	case vBool:
		return v.b, true
	case vNull:
		return tNull, true
	case vStr:
		b, ok := parseBool(v.s)
		if !ok {
			return 0, false
		}
		return boolTruth(b), true
	case vNum:
		return 0, false
	default:
		return tAny, true
	}
}

func boolTruth(b bool) truth {
	if b {
		return tTrue
	}
	return tFalse
}

func boolValue(t truth) value {
	if t == tNull {
		return value{k: vNull}
	}
	return value{k: vBool, b: t}
}

// fold evaluates an expression as far as constants allow. Any node it does
// not understand is unknown, which keeps the guard on the safe side: a write
// is flagged only when its condition is proved to match every row.
func fold(n *pg.Node) value { return (*folder)(nil).fold(n) }

// folder folds expressions, remembering each node's value when memo is set, so that folding
// every level of a deeply nested condition (as the require_where rule does) stays linear. A nil
// *folder folds without memory.
type folder struct {
	memo map[*pg.Node]value
}

func (f *folder) fold(n *pg.Node) value {
	if n == nil {
		return unknown
	}
	if f == nil {
		return f.foldNode(n)
	}
	if v, ok := f.memo[n]; ok {
		return v
	}
	v := f.foldNode(n)
	f.memo[n] = v
	return v
}

func (f *folder) foldNode(n *pg.Node) value {
	switch x := n.Node.(type) {
	case *pg.Node_AConst:
		return foldConst(x.AConst)
	case *pg.Node_TypeCast:
		return foldCast(f.fold(x.TypeCast.Arg), x.TypeCast.TypeName)
	case *pg.Node_ColumnRef:
		return foldColumn(x.ColumnRef)
	case *pg.Node_BoolExpr:
		return f.foldBoolExpr(x.BoolExpr)
	case *pg.Node_NullTest:
		return f.foldNullTest(x.NullTest)
	case *pg.Node_BooleanTest:
		return f.foldBooleanTest(x.BooleanTest)
	case *pg.Node_AExpr:
		return f.foldAExpr(x.AExpr)
	}
	return unknown
}

func foldConst(c *pg.A_Const) value {
	if c.Isnull {
		return value{k: vNull}
	}
	switch v := c.Val.(type) {
	case *pg.A_Const_Ival:
		return value{k: vNum, n: new(big.Rat).SetInt64(int64(v.Ival.Ival))}
	case *pg.A_Const_Fval:
		r, ok := parseNum(strings.ReplaceAll(v.Fval.Fval, "_", ""))
		if !ok {
			return unknown
		}
		return value{k: vNum, n: r}
	case *pg.A_Const_Boolval:
		return value{k: vBool, b: boolTruth(v.Boolval.Boolval)}
	case *pg.A_Const_Sval:
		return value{k: vStr, s: v.Sval.Sval}
	}
	return unknown // bit strings and anything newer
}

func foldColumn(c *pg.ColumnRef) value {
	parts := make([]string, 0, len(c.Fields))
	for _, f := range c.Fields {
		s, ok := f.Node.(*pg.Node_String_)
		if !ok {
			return unknown // t.* and friends
		}
		parts = append(parts, s.String_.Sval)
	}
	return value{k: vCol, col: strings.Join(parts, ".")}
}

// typeName returns the last component of a type name ("pg_catalog.bool" ->
// "bool"), or "" for array types and anything unusual.
func typeName(t *pg.TypeName) string {
	if t == nil || len(t.ArrayBounds) > 0 || t.Setof || t.PctType || len(t.Names) == 0 {
		return ""
	}
	s, ok := t.Names[len(t.Names)-1].Node.(*pg.Node_String_)
	if !ok {
		return ""
	}
	return s.String_.Sval
}

func foldCast(v value, t *pg.TypeName) value {
	name := typeName(t)
	if name == "" || v.k == vUnknown || v.k == vCol {
		return unknown
	}
	if v.k == vNull {
		return v
	}
	switch name {
	case "bool", "boolean":
		switch v.k {
		case vBool:
			return v
		case vStr:
			b, ok := parseBool(v.s)
			if !ok {
				return unknown
			}
			return value{k: vBool, b: boolTruth(b)}
		case vNum:
			if !v.n.IsInt() {
				return unknown // no cast from numeric to boolean
			}
			return value{k: vBool, b: boolTruth(v.n.Sign() != 0)}
		}
	case "int2", "int4", "int8", "smallint", "integer", "int", "bigint", "numeric", "decimal":
		switch v.k {
		case vNum:
			if name != "numeric" && name != "decimal" && !v.n.IsInt() {
				return unknown // rounding rules not modelled
			}
			return v
		case vStr:
			r, ok := parseNum(strings.TrimSpace(v.s))
			if !ok || (name != "numeric" && name != "decimal" && !r.IsInt()) {
				return unknown
			}
			return value{k: vNum, n: r}
		}
	case "text", "varchar", "bpchar", "name":
		if v.k == vStr && len(t.Typmods) == 0 {
			return v
		}
	}
	return unknown
}

func (f *folder) foldBoolExpr(e *pg.BoolExpr) value {
	args := make([]truth, len(e.Args))
	for i, a := range e.Args {
		t, ok := f.fold(a).asTruth()
		if !ok {
			return unknown
		}
		args[i] = t
	}
	switch e.Boolop {
	case pg.BoolExprType_NOT_EXPR:
		if len(args) != 1 {
			return unknown
		}
		return boolValue(mapTruth(args[0], func(x truth) truth {
			switch x {
			case tTrue:
				return tFalse
			case tFalse:
				return tTrue
			}
			return tNull
		}))
	case pg.BoolExprType_AND_EXPR, pg.BoolExprType_OR_EXPR:
		and := e.Boolop == pg.BoolExprType_AND_EXPR
		acc := boolTruth(and) // identity: true for AND, false for OR
		for _, a := range args {
			acc = combine(acc, a, func(x, y truth) truth { return and3(x, y, and) })
		}
		return boolValue(acc)
	}
	return unknown
}

// and3 is SQL's three-valued AND (and=true) or OR (and=false) of two single
// truth values.
func and3(x, y truth, and bool) truth {
	dominant, identity := tFalse, tTrue
	if !and {
		dominant, identity = tTrue, tFalse
	}
	switch {
	case x == dominant || y == dominant:
		return dominant
	case x == identity && y == identity:
		return identity
	}
	return tNull
}

// mapTruth applies f to each possible value of t.
func mapTruth(t truth, f func(truth) truth) truth {
	var out truth
	for _, x := range []truth{tTrue, tFalse, tNull} {
		if t&x != 0 {
			out |= f(x)
		}
	}
	return out
}

// combine applies f to every pair of possible values of a and b.
func combine(a, b truth, f func(x, y truth) truth) truth {
	var out truth
	for _, x := range []truth{tTrue, tFalse, tNull} {
		if a&x == 0 {
			continue
		}
		for _, y := range []truth{tTrue, tFalse, tNull} {
			if b&y != 0 {
				out |= f(x, y)
			}
		}
	}
	return out
}

func (f *folder) foldNullTest(e *pg.NullTest) value {
	if e.Argisrow {
		return unknown // row-wise IS NULL has its own rules
	}
	v := f.fold(e.Arg)
	var isNull truth
	switch v.k {
	case vNull:
		isNull = tTrue
	case vNum, vStr:
		isNull = tFalse
	case vBool:
		isNull = mapTruth(v.b, func(x truth) truth { return boolTruth(x == tNull) })
	default:
		return value{k: vBool, b: tTrue | tFalse}
	}
	if e.Nulltesttype == pg.NullTestType_IS_NOT_NULL {
		isNull = mapTruth(isNull, func(x truth) truth { return boolTruth(x == tFalse) })
	} else if e.Nulltesttype != pg.NullTestType_IS_NULL {
		return unknown
	}
	return value{k: vBool, b: isNull}
}

func (f *folder) foldBooleanTest(e *pg.BooleanTest) value {
	t, ok := f.fold(e.Arg).asTruth()
	if !ok {
		return unknown
	}
	var want truth
	neg := false
	switch e.Booltesttype {
	case pg.BoolTestType_IS_TRUE:
		want = tTrue
	case pg.BoolTestType_IS_NOT_TRUE:
		want, neg = tTrue, true
	case pg.BoolTestType_IS_FALSE:
		want = tFalse
	case pg.BoolTestType_IS_NOT_FALSE:
		want, neg = tFalse, true
	case pg.BoolTestType_IS_UNKNOWN:
		want = tNull
	case pg.BoolTestType_IS_NOT_UNKNOWN:
		want, neg = tNull, true
	default:
		return unknown
	}
	return value{k: vBool, b: mapTruth(t, func(x truth) truth { return boolTruth((x == want) != neg) })}
}

// opName returns the operator of an A_Expr: "=" or "pg_catalog.=" -> "=".
func opName(e *pg.A_Expr) string {
	if len(e.Name) == 0 || len(e.Name) > 2 {
		return ""
	}
	if len(e.Name) == 2 {
		s, ok := e.Name[0].Node.(*pg.Node_String_)
		if !ok || s.String_.Sval != "pg_catalog" {
			return ""
		}
	}
	s, ok := e.Name[len(e.Name)-1].Node.(*pg.Node_String_)
	if !ok {
		return ""
	}
	return s.String_.Sval
}

func (f *folder) foldAExpr(e *pg.A_Expr) value {
	op := opName(e)
	switch e.Kind {
	case pg.A_Expr_Kind_AEXPR_OP:
		if e.Lexpr == nil {
			return foldUnary(op, f.fold(e.Rexpr))
		}
		return foldBinary(op, f.fold(e.Lexpr), f.fold(e.Rexpr))
	case pg.A_Expr_Kind_AEXPR_DISTINCT, pg.A_Expr_Kind_AEXPR_NOT_DISTINCT:
		l, r := f.fold(e.Lexpr), f.fold(e.Rexpr)
		var same truth
		switch {
		case l.k == vCol && r.k == vCol && l.col == r.col:
			same = tTrue // NULL is not distinct from NULL
		case l.k == vNull && r.k == vNull:
			same = tTrue
		case l.k == vNull || r.k == vNull:
			if l.k == vUnknown || r.k == vUnknown || l.k == vCol || r.k == vCol {
				return unknown
			}
			same = tFalse
		default:
			c := compare("=", l, r)
			if c.k != vBool || c.b&tNull != 0 {
				return unknown
			}
			same = c.b
		}
		if e.Kind == pg.A_Expr_Kind_AEXPR_DISTINCT {
			same = mapTruth(same, func(x truth) truth { return boolTruth(x == tFalse) })
		}
		return value{k: vBool, b: same}
	case pg.A_Expr_Kind_AEXPR_IN:
		list, ok := e.Rexpr.GetNode().(*pg.Node_List)
		if !ok || (op != "=" && op != "<>") {
			return unknown
		}
		l := f.fold(e.Lexpr)
		acc := tFalse
		for _, item := range list.List.Items {
			c := compare("=", l, f.fold(item))
			t, ok := c.asTruth()
			if !ok {
				return unknown
			}
			acc = combine(acc, t, func(x, y truth) truth { return and3(x, y, false) })
		}
		if op == "<>" {
			acc = mapTruth(acc, func(x truth) truth {
				switch x {
				case tTrue:
					return tFalse
				case tFalse:
					return tTrue
				}
				return tNull
			})
		}
		return boolValue(acc)
	}
	return unknown
}

func foldUnary(op string, v value) value {
	switch {
	case v.k == vNull && (op == "-" || op == "+"):
		return v
	case v.k != vNum:
		return unknown
	case op == "-":
		return value{k: vNum, n: new(big.Rat).Neg(v.n)}
	case op == "+":
		return v
	}
	return unknown
}

func foldBinary(op string, l, r value) value {
	switch op {
	case "=", "<>", "<", ">", "<=", ">=":
		return compare(op, l, r)
	case "+", "-", "*":
		if l.k == vNull || r.k == vNull {
			if l.k == vUnknown || r.k == vUnknown || l.k == vCol || r.k == vCol {
				return unknown
			}
			return value{k: vNull}
		}
		a, aok := toNum(l)
		b, bok := toNum(r)
		if !aok || !bok {
			return unknown
		}
		z := new(big.Rat)
		switch op {
		case "+":
			z.Add(a, b)
		case "-":
			z.Sub(a, b)
		default:
			z.Mul(a, b)
		}
		if z.Num().BitLen()+z.Denom().BitLen() > 64*maxNumLen {
			return unknown
		}
		return value{k: vNum, n: z}
	}
	return unknown
}

// compare folds a comparison. The same bare column on both sides of =, <= or
// >= is true for every row where the column is not null: such a condition is
// treated as matching the whole table.
func compare(op string, l, r value) value {
	if l.k == vCol && r.k == vCol && l.col == r.col {
		switch op {
		case "=", "<=", ">=":
			return value{k: vBool, b: tTrue | tNull}
		case "<>", "<", ">":
			return value{k: vBool, b: tFalse | tNull}
		}
		return unknown
	}
	if l.k == vUnknown || r.k == vUnknown || l.k == vCol || r.k == vCol {
		return unknown
	}
	if l.k == vNull || r.k == vNull {
		return value{k: vNull}
	}
	if l.k == vBool || r.k == vBool {
		return compareBool(op, l, r)
	}
	if l.k == vStr && r.k == vStr {
		// Byte equality is equality under every deterministic collation;
		// ordering depends on the collation, so it stays unknown.
		switch op {
		case "=":
			return value{k: vBool, b: boolTruth(l.s == r.s)}
		case "<>":
			return value{k: vBool, b: boolTruth(l.s != r.s)}
		}
		return unknown
	}
	a, aok := toNum(l)
	b, bok := toNum(r)
	if !aok || !bok {
		return unknown
	}
	return value{k: vBool, b: boolTruth(cmpHolds(op, a.Cmp(b)))}
}

func compareBool(op string, l, r value) value {
	a, aok := l.asTruth()
	b, bok := r.asTruth()
	if !aok || !bok || l.k == vNum || r.k == vNum {
		return unknown
	}
	rank := func(x truth) int { // false < true
		if x == tTrue {
			return 1
		}
		return 0
	}
	return boolValue(combine(a, b, func(x, y truth) truth {
		if x == tNull || y == tNull {
			return tNull
		}
		return boolTruth(cmpHolds(op, rank(x)-rank(y)))
	}))
}

func cmpHolds(op string, c int) bool {
	switch op {
	case "=":
		return c == 0
	case "<>":
		return c != 0
	case "<":
		return c < 0
	case ">":
		return c > 0
	case "<=":
		return c <= 0
	default: // ">="
		return c >= 0
	}
}

// toNum reads a number, or an unknown-typed literal coerced to a number as
// PostgreSQL does when the other side is numeric ('1' = 1).
func toNum(v value) (*big.Rat, bool) {
	switch v.k {
	case vNum:
		return v.n, true
	case vStr:
		return parseNum(strings.TrimSpace(v.s))
	}
	return nil, false
}

// maxNumLen bounds the literals and results the folder computes with, so a
// huge literal or exponent cannot cost time or memory: beyond it a number is
// simply unknown.
const maxNumLen = 64

// parseNum reads a plain decimal number ([+-]digits[.digits][e[+-]digits]).
// Other spellings (hex, fractions, NaN, Infinity) are left unknown.
func parseNum(s string) (*big.Rat, bool) {
	if len(s) == 0 || len(s) > maxNumLen {
		return nil, false
	}
	i := 0
	if s[i] == '+' || s[i] == '-' {
		i++
	}
	digits := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return nil, false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
			exp = exp*10 + int(s[i]-'0')
			if exp > 2*maxNumLen {
				return nil, false
			}
		}
	}
	if i != len(s) {
		return nil, false
	}
	return new(big.Rat).SetString(s)
}

// parseBool accepts what PostgreSQL's boolin accepts: a unique prefix of
// true/false/yes/no, on/off, 1/0, case-insensitive, surrounded by whitespace.
func parseBool(s string) (value, ok bool) {
	s = strings.ToLower(strings.TrimSpace(s))
	if s == "" {
		return false, false
	}
	switch s[0] {
	case 't':
		return true, strings.HasPrefix("true", s)
	case 'f':
		return false, strings.HasPrefix("false", s)
	case 'y':
		return true, strings.HasPrefix("yes", s)
	case 'n':
		return false, strings.HasPrefix("no", s)
	case 'o':
		if s == "on" {
			return true, true
		}
		return false, len(s) >= 2 && strings.HasPrefix("off", s)
	case '1':
		return true, s == "1"
	case '0':
		return false, s == "0"
	}
	return false, false
}
