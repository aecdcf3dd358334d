package facts

import (
	"go/ast"
	"go/token"
	"slices"
	"strings"
	"testing"
)

// TestNoLockHeldAcrossIO: no mutex of the library is held across I/O, a wait or code that is
// not pgtraffic's (the design's rule: a lock is held for in-memory steps only). For each
// Lock or RLock of a mutex, the statements until its Unlock in the same block (to the end of
// the block after a deferred Unlock) may not:
//
//   - call a database or Redis client (Exec, Query, QueryRow, Ping, Prepare, SendBatch,
//     CopyFrom, Explain, Acquire, Eval, EvalSha, Publish, Subscribe, Pipelined), dial, sleep,
//     or touch files and the network (time.Sleep, packages os and net);
//   - compile rules (Compile);
//   - log (a logger's Debug, Info, Warn, Error, Log or LogAttrs: the application's handler)
//     or call the engine's observer (Started, Finished, Blocked, Decision: the application's
//     telemetry);
//   - send on or receive from a channel other than in a select with a default.
//
// Calls are judged by name, not by type: a method of that name on an in-memory value must be
// renamed or its lock released first. What a called function does in turn is not followed:
// each function is checked where its own locks are. The packages that only tests import
// (testSupport) are not the library's: a test server may hold its lock across its files.
func TestNoLockHeldAcrossIO(t *testing.T) {
	m := load(t)
	for _, f := range m.files {
		if slices.Contains(testSupport, f.dir) {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			var body *ast.BlockStmt
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body = fn.Body
			case *ast.FuncLit:
				body = fn.Body
			}
			if body != nil {
				checkLocks(t, m.fset, f, body.List)
			}
			return true
		})
	}
}

// testSupport are the packages that only tests and measuring tools import.
var testSupport = []string{"internal/pgtest", "internal/pgtest/cmd/pgtest", "internal/fakeclock", "internal/redistest",
	"internal/delayproxy"}

// checkLocks checks the lock regions that begin in list, and those of the blocks nested in it.
func checkLocks(t *testing.T, fset *token.FileSet, f *file, list []ast.Stmt) {
	for i, s := range list {
		mu, lock := lockCall(s, "Lock", "RLock")
		if !lock {
			continue
		}
		region := list[i+1:]
		for j, r := range region {
			if other, ok := lockCall(r, "Unlock", "RUnlock"); ok && other == mu {
				region = region[:j]
				break
			}
		}
		for _, r := range region {
			held(t, fset, f, mu, r)
		}
	}
}

// lockCall reports whether s is the statement mu.<one of names>(), and mu. A deferred Unlock
// is not one: it ends nothing before the function returns.
func lockCall(s ast.Stmt, names ...string) (mu string, ok bool) {
	es, _ := s.(*ast.ExprStmt)
	if es == nil {
		return "", false
	}
	call, _ := es.X.(*ast.CallExpr)
	if call == nil || len(call.Args) != 0 {
		return "", false
	}
	sel, _ := call.Fun.(*ast.SelectorExpr)
	if sel == nil {
		return "", false
	}
	for _, n := range names {
		if sel.Sel.Name == n {
			return exprText(sel.X), true
		}
	}
	return "", false
}

// held reports what s does that it may not while mu is held. A nested block stops at mu's
// Unlock (an early return that unlocks first), and a function literal is not run here.
func held(t *testing.T, fset *token.FileSet, f *file, mu string, s ast.Stmt) {
	ast.Inspect(s, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncLit:
			return false
		case *ast.BlockStmt:
			for _, st := range n.List {
				if other, ok := lockCall(st, "Unlock", "RUnlock"); ok && other == mu {
					break
				}
				held(t, fset, f, mu, st)
			}
			return false
		case *ast.CaseClause:
			for _, st := range n.Body {
				held(t, fset, f, mu, st)
			}
			return false
		case *ast.SelectStmt:
			if !hasDefault(n) {
				t.Errorf("%s: a select without a default, which may wait, while %s is held", fset.Position(n.Pos()), mu)
			}
			for _, c := range n.Body.List {
				for _, st := range c.(*ast.CommClause).Body {
					held(t, fset, f, mu, st)
				}
			}
			return false
		case *ast.SendStmt:
			t.Errorf("%s: a channel send, which may wait, while %s is held", fset.Position(n.Pos()), mu)
		case *ast.UnaryExpr:
			if n.Op == token.ARROW {
				t.Errorf("%s: a channel receive, which may wait, while %s is held", fset.Position(n.Pos()), mu)
			}
		case *ast.CallExpr:
			if what := forbidden(f, n); what != "" {
				t.Errorf("%s: %s while %s is held", fset.Position(n.Pos()), what, mu)
			}
		}
		return true
	})
}

func hasDefault(s *ast.SelectStmt) bool {
	for _, c := range s.Body.List {
		if c.(*ast.CommClause).Comm == nil {
			return true
		}
	}
	return false
}

// forbidden names what call does that no lock may be held across, or "".
func forbidden(f *file, call *ast.CallExpr) string {
	sel, _ := call.Fun.(*ast.SelectorExpr)
	if sel == nil {
		return ""
	}
	name := sel.Sel.Name
	if pkg, ok := sel.X.(*ast.Ident); ok {
		switch {
		case pkg.Name == "time" && name == "Sleep" && importsStd(f, "time"):
			return "time.Sleep"
		case (pkg.Name == "os" || pkg.Name == "net") && importsStd(f, pkg.Name):
			return pkg.Name + "." + name
		}
	}
	switch name {
	case "Exec", "Query", "QueryRow", "Ping", "Prepare", "SendBatch", "CopyFrom", "Explain", "Acquire",
		"Eval", "EvalSha", "Publish", "Subscribe", "Pipelined", "Dial", "DialContext":
		return "a database or Redis call (" + name + ")"
	case "Compile":
		return "a compile (" + name + ")"
	case "Debug", "Info", "Warn", "Error", "Log", "LogAttrs":
		if len(call.Args) > 0 { // err.Error() formats a value
			return "a log call (" + name + ": the application's handler)"
		}
	case "Started", "Finished", "Blocked", "Decision":
		if len(call.Args) > 0 {
			return "a call of the observer (" + name + ": the application's telemetry)"
		}
	}
	return ""
}

// importsStd reports whether f imports the standard library package name.
func importsStd(f *file, name string) bool {
	for _, is := range f.ast.Imports {
		if strings.Trim(is.Path.Value, `"`) == name && is.Name == nil {
			return true
		}
	}
	return false
}

// exprText is e as written, for the receivers of Lock and Unlock (c.mu, b.mu, mu).
func exprText(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprText(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + exprText(e.X)
	case *ast.IndexExpr:
		return exprText(e.X) + "[" + exprText(e.Index) + "]"
	case *ast.CallExpr:
		return exprText(e.Fun) + "()"
	case *ast.ParenExpr:
		return exprText(e.X)
	}
	return "?"
}
