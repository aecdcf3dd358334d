package pattern

import (
	"sort"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v5"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/guard"
)

// walker visits a parse tree once and collects tables and the events of the
// query summary. It is single-use and not safe for concurrent use.
type walker struct {
	tables  map[string]struct{}
	bare    map[string]struct{} // the relation names of the tables written schema-qualified
	events  []event
	ctes    []string // CTE names in scope, innermost last
	stmtLoc int      // offset of the statement being visited
	// valueClauses names, in walk order, the clauses that are a bare value (WHERE false, LIMIT
	// 10, OFFSET $1, HAVING true): pg_query's fingerprint leaves values out, and with them such
	// a clause whole, so that `select … where false` and `select …`, or `… limit 10` and `…`,
	// would be one pattern, the full scan priced as its empty twin. They are mixed into the
	// fingerprint (analyze).
	valueClauses []string
}

// noteValue notes clause, named name, when it is a bare value (walker.valueClauses).
func (w *walker) noteValue(name string, clause *pg.Node) {
	if bareValue(clause) {
		w.valueClauses = append(w.valueClauses, name)
	}
}

// bareValue reports whether n is a constant or a parameter, cast or not.
func bareValue(n *pg.Node) bool {
	if n == nil {
		return false
	}
	switch x := n.Node.(type) {
	case *pg.Node_AConst, *pg.Node_ParamRef:
		return true
	case *pg.Node_TypeCast:
		return bareValue(x.TypeCast.Arg)
	}
	return false
}

// event is an operation or a table at a byte offset of the text, for the
// summary.
type event struct {
	loc   int
	op    string // operation, or "" for a table
	table string
	stmt  bool // a top-level statement's own operation: named even without a table
}

// node visits n and everything below it.
func (w *walker) node(n *pg.Node) {
	if n == nil || n.Node == nil {
		return
	}
	switch x := n.Node.(type) {
	case *pg.Node_SelectStmt:
		w.selectStmt(x.SelectStmt)
	case *pg.Node_InsertStmt:
		w.dml("INSERT", x.InsertStmt)
	case *pg.Node_UpdateStmt:
		w.noteValue("where", x.UpdateStmt.WhereClause)
		w.dml("UPDATE", x.UpdateStmt)
	case *pg.Node_DeleteStmt:
		w.noteValue("where", x.DeleteStmt.WhereClause)
		w.dml("DELETE", x.DeleteStmt)
	case *pg.Node_MergeStmt:
		w.dml("MERGE", x.MergeStmt)
	case *pg.Node_DropStmt:
		w.dropStmt(x.DropStmt)
	case *pg.Node_RangeVar:
		w.rangeVar(x.RangeVar)
	default:
		// A Node holds exactly one message in its oneof: walk that.
		n.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Message() != nil {
				w.fields(v.Message())
			}
			return false
		})
	}
}

// fields visits every message-typed field of m except those named in skip.
func (w *walker) fields(m protoreflect.Message, skip ...protoreflect.Name) {
	guard.EachChild(m, w.child, skip...)
}

// child visits a message-typed field value.
func (w *walker) child(m protoreflect.Message) {
	switch x := m.Interface().(type) {
	case *pg.Node:
		w.node(x)
	case *pg.SelectStmt: // SelectStmt.larg/rarg
		w.selectStmt(x)
	case *pg.RangeVar:
		w.rangeVar(x)
	default:
		w.fields(m)
	}
}

// selectStmt records a SELECT operation anchored at its first output column
// (so that INSERT ... SELECT reads in source order) and visits it.
func (w *walker) selectStmt(s *pg.SelectStmt) {
	if s == nil {
		return
	}
	w.noteValue("where", s.WhereClause)
	w.noteValue("having", s.HavingClause)
	w.noteValue("limit", s.LimitCount)
	w.noteValue("offset", s.LimitOffset)
	if s.Op == pg.SetOperation_SETOP_NONE && len(s.ValuesLists) == 0 {
		loc := -1
		if len(s.TargetList) > 0 {
			if rt, ok := s.TargetList[0].Node.(*pg.Node_ResTarget); ok {
				loc = int(rt.ResTarget.Location)
			}
		}
		w.opEvent("SELECT", loc, func() { w.withScope(s.WithClause, s, "") })
		return
	}
	w.withScope(s.WithClause, s, "")
}

// writeStmt is what an INSERT, UPDATE, DELETE and MERGE statement have in common.
type writeStmt interface {
	protoreflect.ProtoMessage
	GetRelation() *pg.RangeVar
	GetWithClause() *pg.WithClause
}

// dml records an INSERT/UPDATE/DELETE/MERGE anchored at its target table.
func (w *walker) dml(op string, s writeStmt) {
	rel := s.GetRelation()
	loc := -1
	if rel != nil {
		loc = int(rel.Location)
	}
	w.opEvent(op, loc, func() {
		// The target is never a CTE, even when one has its name.
		w.rangeVar(rel, false)
		w.withScope(s.GetWithClause(), s, "relation")
	})
}

// opEvent appends an operation event at loc, or, when loc is unknown, just
// before the first event its body produces.
func (w *walker) opEvent(op string, loc int, body func()) {
	i := len(w.events)
	w.events = append(w.events, event{loc: loc, op: op})
	body()
	if loc < 0 {
		w.events[i].loc = -1
		for _, e := range w.events[i+1:] {
			if e.loc >= 0 && (w.events[i].loc < 0 || e.loc < w.events[i].loc) {
				w.events[i].loc = e.loc
			}
		}
		if w.events[i].loc < 0 {
			w.events = append(w.events[:i], w.events[i+1:]...)
		}
	}
}

// withScope visits a statement with its WITH clause: CTE names are not
// tables inside the statement, and (unless RECURSIVE) a CTE sees only the
// ones before it.
func (w *walker) withScope(with *pg.WithClause, s protoreflect.ProtoMessage, skip protoreflect.Name) {
	base := len(w.ctes)
	if with != nil {
		if with.Recursive {
			for _, c := range with.Ctes {
				if cte, ok := c.Node.(*pg.Node_CommonTableExpr); ok {
					w.ctes = append(w.ctes, cte.CommonTableExpr.Ctename)
				}
			}
		}
		for _, c := range with.Ctes {
			cte, ok := c.Node.(*pg.Node_CommonTableExpr)
			if !ok {
				continue
			}
			w.node(cte.CommonTableExpr.Ctequery)
			if !with.Recursive {
				w.ctes = append(w.ctes, cte.CommonTableExpr.Ctename)
			}
		}
	}
	w.fields(s.ProtoReflect(), "with_clause", skip)
	w.ctes = w.ctes[:base]
}

// rangeVar records a relation; with scoped, an unqualified name that is a
// CTE in scope is not one.
func (w *walker) rangeVar(r *pg.RangeVar, scoped ...bool) {
	if r == nil || r.Relname == "" {
		return
	}
	if r.Schemaname == "" && r.Catalogname == "" && (len(scoped) == 0 || scoped[0]) {
		for _, c := range w.ctes {
			if c == r.Relname {
				return
			}
		}
	}
	name := r.Relname
	if r.Schemaname != "" {
		name = r.Schemaname + "." + name
	}
	if r.Catalogname != "" {
		name = r.Catalogname + "." + name
	}
	w.addTable(name, r.Relname, int(r.Location))
}

// addTable records table name, whose relation name is rel (name without its schema and
// catalog, if written so), at text offset loc, valid UTF-8 (see Pattern.Normalized).
func (w *walker) addTable(name, rel string, loc int) {
	name = bounded.Valid(name)
	w.tables[name] = struct{}{}
	if rel != "" && rel != name {
		w.bare[bounded.Valid(rel)] = struct{}{}
	}
	w.events = append(w.events, event{loc: loc, table: name})
}

// dropStmt records the relations a DROP TABLE/VIEW/... names; they are
// lists of strings, not RangeVars.
func (w *walker) dropStmt(d *pg.DropStmt) {
	switch d.RemoveType {
	case pg.ObjectType_OBJECT_TABLE, pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_MATVIEW,
		pg.ObjectType_OBJECT_FOREIGN_TABLE:
	default:
		return
	}
	for _, o := range d.Objects {
		l, ok := o.Node.(*pg.Node_List)
		if !ok {
			continue
		}
		parts := make([]string, 0, len(l.List.Items))
		for _, it := range l.List.Items {
			if s, ok := it.Node.(*pg.Node_String_); ok {
				parts = append(parts, s.String_.Sval)
			}
		}
		if len(parts) > 0 {
			w.addTable(strings.Join(parts, "."), parts[len(parts)-1], w.stmtLoc)
		}
	}
}

// summary builds db.query.summary from the events in text order: each
// operation followed by the tables after it. A nested operation naming no
// table (a subquery of constants) is left out; a statement's own operation
// is always named, once when repeated ("SELECT" for SELECT 1).
func (w *walker) summary() string {
	ev := w.events
	sort.SliceStable(ev, func(i, j int) bool {
		if ev[i].loc != ev[j].loc {
			return ev[i].loc < ev[j].loc
		}
		return ev[i].op != "" && ev[j].op == "" // an operation before its table
	})
	var b strings.Builder
	add := func(s string) bool {
		if b.Len()+1+len(s) > maxSummary {
			return false
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(s)
		return true
	}
	pending, pendingStmt := "", false
	var group []string // tables already named by the current operation
	for _, e := range ev {
		if e.op != "" {
			if e.op == pending {
				pendingStmt = pendingStmt || e.stmt
				continue
			}
			if pendingStmt && !add(pending) {
				break
			}
			pending, pendingStmt = e.op, e.stmt
			continue
		}
		if pending != "" {
			if !add(pending) {
				break
			}
			pending, pendingStmt, group = "", false, group[:0]
		}
		dup := false
		for _, g := range group {
			dup = dup || g == e.table
		}
		if dup {
			continue
		}
		group = append(group, e.table)
		if !add(e.table) {
			break
		}
	}
	if pendingStmt {
		add(pending)
	}
	return b.String()
}
