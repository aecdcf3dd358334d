package guard

import (
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
)

// truth is the value of a condition that is the same for every row.
type truth uint8

const (
	tTrue truth = iota
	tFalse
	tNull
)

// neverTrue reports whether the condition n is never true or, when neg, never false (so that
// NOT n is never true). It proves this for literals ([constant]), for comparisons of a column,
// parameter or literal with itself (x <> x is never true, x = x never false; see identical),
// and through NOT, AND and OR. Anything else may be either.
func (r *restrictor) neverTrue(n *pg.Node, neg bool) bool {
	return memo(r.never, polar{n, neg}, func() bool { return r.neverTrueNode(n, neg) })
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
		if !r.identical(e.Lexpr, e.Rexpr) {
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

// constant evaluates a condition made only of literals: a boolean or NULL literal; a
// comparison or IN list of numbers, or (=, <>) of strings, since the order of strings depends
// on the collation; IS [NOT] NULL, TRUE, FALSE or UNKNOWN of these. ok is false for anything
// else, which may be true or not.
func constant(n *pg.Node) (v truth, ok bool) {
	switch x := n.GetNode().(type) {
	case *pg.Node_AConst:
		if x.AConst.Isnull {
			return tNull, true
		}
		if b := x.AConst.GetBoolval(); b != nil {
			return boolTruth(b.Boolval), true
		}
	case *pg.Node_NullTest:
		null, ok := constantNull(x.NullTest.Arg)
		if !ok || x.NullTest.Argisrow {
			return 0, false
		}
		return boolTruth(null == (x.NullTest.Nulltesttype == pg.NullTestType_IS_NULL)), true
	case *pg.Node_BooleanTest:
		a, ok := constant(x.BooleanTest.Arg)
		t := x.BooleanTest.Booltesttype
		if !ok || t < pg.BoolTestType_IS_TRUE || t > pg.BoolTestType_IS_NOT_UNKNOWN {
			return 0, false
		}
		// IS TRUE, IS NOT TRUE, IS FALSE ... IS NOT UNKNOWN are 1 to 6: IS X, then IS NOT X.
		want := [...]truth{tTrue, tFalse, tNull}[(t-1)/2]
		return boolTruth((a == want) == (t%2 == 1)), true
	case *pg.Node_AExpr:
		e := x.AExpr
		op := opName(e)
		switch {
		case e.Kind == pg.A_Expr_Kind_AEXPR_OP && complement[op] != "":
			return compare(op, e.Lexpr, e.Rexpr)
		case e.Kind == pg.A_Expr_Kind_AEXPR_IN && (op == "=" || op == "<>") && e.Rexpr.GetList() != nil:
			// x IN (a, b) is x = a OR x = b; x NOT IN (a, b) its negation.
			in := tFalse
			for _, item := range e.Rexpr.GetList().Items {
				c, ok := compare("=", e.Lexpr, item)
				switch {
				case !ok:
					return 0, false
				case c == tTrue || in == tTrue:
					in = tTrue
				case c == tNull:
					in = tNull
				}
			}
			if op == "<>" && in != tNull {
				in = boolTruth(in == tFalse)
			}
			return in, true
		}
	}
	return 0, false
}

// constantNull reports whether a literal or a constant condition is NULL.
func constantNull(n *pg.Node) (null, ok bool) {
	if l, ok := literal(n); ok {
		return l.null, true
	}
	v, ok := constant(n)
	return v == tNull, ok
}

// compare evaluates the comparison l op r of two literals. Strings are equal when their bytes
// are, as under every deterministic collation (a database's default collation is one).
func compare(op string, l, r *pg.Node) (truth, bool) {
	a, aok := literal(l)
	b, bok := literal(r)
	switch {
	case !aok || !bok:
		return 0, false
	case a.null || b.null:
		return tNull, true
	case a.num != b.num || !a.num && op != "=" && op != "<>" && op != "!=":
		return 0, false
	}
	c := strings.Compare(a.s, b.s)
	if a.num {
		c = compareDecimals(a.s, b.s)
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

// lit is the value of a literal: NULL, a number (its [decimal] text) or a string.
type lit struct {
	null, num bool
	s         string
}

// literal returns the value of a literal. A string with a backslash has none: pg_query reads
// '\a' as two bytes, a server with standard_conforming_strings off as 'a'.
func literal(n *pg.Node) (lit, bool) {
	c := n.GetAConst()
	switch {
	case c == nil:
		return lit{}, false
	case c.Isnull:
		return lit{null: true}, true
	case c.GetSval() != nil:
		return lit{s: c.GetSval().Sval}, !strings.Contains(c.GetSval().Sval, `\`)
	}
	d, ok := decimal(c)
	return lit{num: true, s: d}, ok
}

// decimal returns the canonical text of a numeric literal written as digits with an optional
// sign and fraction: no leading zeros in its integer part ("0" if it is empty), no trailing
// zeros in its fraction, no point without one, no sign but a minus on a non-zero number:
// "007.50" is "7.5", "-1.0" is "-1", "-0" is "0". Other spellings (exponents, hexadecimal) are
// not read.
func decimal(c *pg.A_Const) (string, bool) {
	text := ""
	if i := c.GetIval(); i != nil {
		text = strconv.Itoa(int(i.Ival))
	} else if f := c.GetFval(); f != nil {
		text = strings.ReplaceAll(f.Fval, "_", "")
	} else {
		return "", false
	}
	mag, minus := strings.CutPrefix(text, "-")
	whole, frac, _ := strings.Cut(mag, ".")
	whole, frac = strings.TrimLeft(whole, "0"), strings.TrimRight(frac, "0")
	if strings.Trim(whole+frac, "0123456789") != "" {
		return "", false
	}
	if whole == "" {
		whole = "0"
	}
	if frac != "" {
		whole += "." + frac
	}
	if minus && whole != "0" {
		return "-" + whole, true
	}
	return whole, true
}

// compareDecimals compares two [decimal] texts.
func compareDecimals(a, b string) int {
	am, aneg := strings.CutPrefix(a, "-")
	bm, bneg := strings.CutPrefix(b, "-")
	switch {
	case aneg != bneg && aneg:
		return -1
	case aneg != bneg:
		return 1
	case aneg:
		return compareMagnitudes(bm, am)
	}
	return compareMagnitudes(am, bm)
}

// compareMagnitudes compares two unsigned [decimal] texts.
func compareMagnitudes(a, b string) int {
	aw, af, _ := strings.Cut(a, ".")
	bw, bf, _ := strings.Cut(b, ".")
	if len(aw) != len(bw) {
		return len(aw) - len(bw)
	}
	if c := strings.Compare(aw, bw); c != 0 {
		return c
	}
	return strings.Compare(af, bf)
}

func boolTruth(b bool) truth {
	if b {
		return tTrue
	}
	return tFalse
}
