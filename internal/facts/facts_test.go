package facts

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/pgtraffic/pgtraffic"

// The constants whose string values must be spelled as a literal exactly once in non-test
// code: every Reason* constant of reasonPackages, every string constant of namePackages, the
// constants of telemetryPackages named with one of its prefixes (metric and attribute names),
// and namedStrings.
var (
	reasonPackages    = []string{"driver/rules/vocab"}
	namePackages      = []string{"driver/rules/vocab"}
	telemetryPackages = map[string][]string{"driver": {"metric", "attr", "event"}}
	namedStrings      = []string{"internal/health.ApplicationName"}
)

// otherStringFacts counts, per file, the literals whose text equals a watched string but that
// name something else: a log attribute key, the kind of refuser in an error message. A literal
// beyond these counts is a restated fact. (The rules decoder and validator spell no field name:
// they read them from the struct tags.)
var otherStringFacts = map[string]map[string]int{
	"driver/errors.go":        {"guard": 1, "budget": 1},              // "blocked by guard …", "blocked by budget …"
	"internal/engine/log.go":  {"budget": 1, "fingerprint": 1},        // log attributes
	"internal/guard/guard.go": {"delete": 1, "merge": 1, "update": 1}, // SQL keywords of the word check
	// PostgreSQL's application_name parameter, not the built-in tag of that name.
	"driver/core.go":                       {"application_name": 1},
	"internal/serverclock/pgxconn/conn.go": {"application_name": 1},
}

// defaults are the module's defaults and bounds, each named by the one constant that defines
// it (package directory and name). Every constant whose name starts with Default or default
// must be here, so that a default restated under a new name fails. byValue marks the ones
// whose value is distinctive enough to check that no other literal in non-test code spells it;
// the others (1, 10, a second, 100ms) are spelled for unrelated reasons all over, and were
// audited by hand.
var defaults = []struct {
	name    string
	byValue bool
}{
	{"driver/rules.DefaultMaxFileSize", true},
	{"driver/rules.DefaultServerCores", false},
	{"driver/rules.DefaultSyncInterval", false},
	{"driver/rules.DefaultFallbackInstances", false},
	{"driver/rules.DefaultMaxQueue", false},
	{"driver/rules/vocab.DefaultHealthInterval", false},
	{"internal/budget.DefaultMaxKeys", true},
	{"driver/rules/vocab.DefaultBurstWindow", false},
	{"internal/budget.defaultHold", false},
	{"internal/pattern.DefaultMaxEntries", true},
	{"internal/pattern.defaultMaxBytes", true},
	{"internal/cost.DefaultGlobalK", true},
	{"internal/cost.PlanTTL", true},
	{"internal/runtime.closeWithin", true},
}

// otherValueFacts are named constants that share a default's value but are facts of their own.
var otherValueFacts = map[string]string{
	"internal/coord.maxLive":         "bounds the instance count a Redis reply may report",
	"internal/coord.secretRetry":     "bounds the wait between two readings of the election's secret",
	"internal/engine.maxQuarantined": "bounds the quarantine table",
	"internal/loglimit.maxKeys":      "bounds the log rate limiter's table",
	"driver/rules.MaxSyncInterval":   "the longest sync_interval",
	"internal/pgtest.execTimeout":    "bounds a test server's setup statement",
	"internal/engine.trueUpWithin":   "how long a charge on the client's clock waits for the server's report",
	"driver/rules.minAliasBound":     "the fewest nodes a YAML file's aliases may stand for",
}

// TestEachFactDefinedOnce: reason strings, health metric names and defaults are each spelled as
// a literal once in the module's non-test code (examples and nested modules aside); everything
// else refers to the constant.
func TestEachFactDefinedOnce(t *testing.T) {
	m := load(t)
	t.Run("strings", func(t *testing.T) { m.checkStrings(t) })
	t.Run("defaults", func(t *testing.T) { m.checkDefaults(t) })
}

func (m *mod) checkStrings(t *testing.T) {
	watched := map[string]string{} // value → the constant defining it
	add := func(key string) {
		v, _, ok := m.eval(m.consts[key], map[string]bool{})
		if !ok || v.Kind() != constant.String {
			t.Fatalf("%s: not a string constant", key)
		}
		// Of a constant and the ones referring to it (driver.ReasonBudget = vocab.ReasonBudget),
		// name the definition.
		if def, seen := watched[constant.StringVal(v)]; !seen || !m.isLiteral(def) {
			watched[constant.StringVal(v)] = key
		}
	}
	for _, dir := range reasonPackages {
		for _, key := range m.constsOf(dir) {
			if strings.HasPrefix(key[len(dir)+1:], "Reason") {
				add(key)
			}
		}
	}
	for _, dir := range namePackages {
		for _, key := range m.constsOf(dir) {
			if v, _, ok := m.eval(m.consts[key], map[string]bool{}); ok && v.Kind() == constant.String {
				add(key)
			}
		}
	}
	for dir, prefixes := range telemetryPackages {
		for _, key := range m.constsOf(dir) {
			name := key[len(dir)+1:]
			if slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
				add(key)
			}
		}
	}
	for _, key := range namedStrings {
		add(key)
	}
	if len(watched) < 12 {
		t.Fatalf("only %d watched strings: the constants were not found", len(watched))
	}
	// value → file → the literals spelling it there
	sites := map[string]map[string][]token.Position{}
	for _, f := range m.files {
		var visit func(n ast.Node) bool
		visit = func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ImportSpec:
				return false
			case *ast.Field:
				if n.Tag != nil { // a struct tag names a field, not a value
					for _, name := range n.Names {
						ast.Inspect(name, visit)
					}
					ast.Inspect(n.Type, visit)
					return false
				}
			case *ast.BasicLit:
				if n.Kind != token.STRING {
					return true
				}
				v, err := strconv.Unquote(n.Value)
				if _, ok := watched[v]; err != nil || !ok {
					return true
				}
				if sites[v] == nil {
					sites[v] = map[string][]token.Position{}
				}
				sites[v][f.path] = append(sites[v][f.path], m.fset.Position(n.Pos()))
			}
			return true
		}
		ast.Inspect(f.ast, visit)
	}
	for _, path := range sortedKeys(otherStringFacts) {
		for _, v := range sortedKeys(otherStringFacts[path]) {
			if n, allowed := len(sites[v][path]), otherStringFacts[path][v]; n < allowed {
				t.Errorf("otherStringFacts allows %d literals %q in %s, which has %d: lower it", allowed, v, path, n)
			}
		}
	}
	for _, v := range sortedKeys(watched) {
		n := 0 // literals spelling the watched value, not another fact
		var report []token.Position
		var others []string
		for _, path := range sortedKeys(sites[v]) {
			ps, allowed := sites[v][path], otherStringFacts[path][v]
			if extra := len(ps) - allowed; extra > 0 {
				n += extra
				report = append(report, ps...)
				if allowed > 0 {
					others = append(others, fmt.Sprintf("%d in %s", allowed, path))
				}
			}
		}
		switch {
		case n == 0:
			t.Errorf("%q (%s) is not spelled anywhere: is its constant still initialised from a literal?", v, watched[v])
		case n > 1:
			note := ""
			if len(others) > 0 {
				note = " (of these, " + strings.Join(others, ", ") + " name another fact: see otherStringFacts)"
			}
			t.Errorf("%q (%s) is spelled as a literal %d times in non-test code; keep the definition and refer to it%s:%s",
				v, watched[v], n, note, positions(m.root, report))
		}
	}
}

func (m *mod) checkDefaults(t *testing.T) {
	listed := map[string]bool{}
	for _, d := range defaults {
		listed[d.name] = true
		e, ok := m.consts[d.name]
		if !ok {
			t.Errorf("%s: no such constant (renamed? update the table)", d.name)
			continue
		}
		if _, _, ok := m.literal(e); !ok {
			t.Errorf("%s is not initialised from a literal: the table must name the definition", d.name)
		}
	}
	// A default not in the table may be a restatement of one that is.
	for _, key := range sortedKeys(m.consts) {
		name := key[strings.LastIndex(key, ".")+1:]
		if listed[key] || !(strings.HasPrefix(name, "Default") || strings.HasPrefix(name, "default")) {
			continue
		}
		v, class, ok := m.literal(m.consts[key])
		if !ok {
			continue // it refers to another constant
		}
		var same []string
		for _, d := range defaults {
			if w, wc, ok := m.literal(m.consts[d.name]); ok && wc == class && constant.Compare(v, token.EQL, w) {
				same = append(same, d.name)
			}
		}
		t.Errorf("%s (%s) is a default initialised from a literal that the table does not list; "+
			"if it restates a default (same value: %v), refer to that constant, else add it to the table", key, v, same)
	}
	for _, key := range sortedKeys(otherValueFacts) {
		if _, ok := m.consts[key]; !ok {
			t.Errorf("otherValueFacts lists %s, which is no longer a constant: remove it", key)
		}
	}
	// No other literal spells a distinctive default.
	for _, d := range defaults {
		if !d.byValue {
			continue
		}
		want, class, ok := m.literal(m.consts[d.name])
		if !ok {
			continue
		}
		var again []token.Position
		for _, s := range m.literalSites() {
			if s.class != class || !constant.Compare(s.value, token.EQL, want) || s.constant == d.name {
				continue
			}
			if _, ok := otherValueFacts[s.constant]; ok {
				continue
			}
			again = append(again, s.pos)
		}
		if len(again) > 0 {
			t.Errorf("%s = %s is spelled again in non-test code; refer to it (or, for another fact of the same value, "+
				"name it and list it in otherValueFacts):%s", d.name, want, positions(m.root, again))
		}
	}
}

// mod is the module's non-test Go source.
type mod struct {
	root   string
	fset   *token.FileSet
	files  []*file
	consts map[string]*declared // "dir.Name" of every package-level const and var with a value
	sites  []site
}

type file struct {
	path    string // relative to the module root, slash-separated
	dir     string
	ast     *ast.File
	imports map[string]string // local name → module-relative directory, or "time"
}

type declared struct {
	f    *file
	expr ast.Expr
}

// site is a maximal expression built of literals alone.
type site struct {
	value    constant.Value
	class    string // "duration" when it involves a time unit or a Duration conversion, else "number"
	pos      token.Position
	constant string // the constant it initialises, or ""
}

// load parses every non-test .go file of the module but examples/, testdata and nested modules.
func load(t *testing.T) *mod {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "go.mod")); err != nil || !strings.HasPrefix(string(b), "module "+module+"\n") {
		t.Fatalf("%s is not the module root: %v", root, err)
	}
	m := &mod{root: root, fset: token.NewFileSet(), consts: map[string]*declared{}}
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		if d.IsDir() {
			if p == root {
				return nil
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a module of its own
			}
			if n := d.Name(); n == "examples" || n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(rel, ".go") || strings.HasSuffix(rel, "_test.go") {
			return nil
		}
		af, err := parser.ParseFile(m.fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		f := &file{path: rel, dir: pathDir(rel), ast: af, imports: map[string]string{}}
		for _, is := range af.Imports {
			ip, _ := strconv.Unquote(is.Path.Value)
			name := ip[strings.LastIndex(ip, "/")+1:]
			if is.Name != nil {
				name = is.Name.Name
			}
			switch {
			case ip == "time":
				f.imports[name] = "time"
			case strings.HasPrefix(ip, module+"/"):
				f.imports[name] = strings.TrimPrefix(ip, module+"/")
			}
		}
		for _, decl := range af.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || (gd.Tok != token.CONST && gd.Tok != token.VAR) {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) && name.Name != "_" {
						m.consts[f.dir+"."+name.Name] = &declared{f: f, expr: vs.Values[i]}
					}
				}
			}
		}
		m.files = append(m.files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(m.files) < 50 {
		t.Fatalf("only %d files under %s", len(m.files), root)
	}
	return m
}

func pathDir(rel string) string {
	if i := strings.LastIndex(rel, "/"); i >= 0 {
		return rel[:i]
	}
	return "."
}

func (m *mod) constsOf(dir string) []string {
	var out []string
	for key := range m.consts {
		if strings.HasPrefix(key, dir+".") && !strings.Contains(key[len(dir)+1:], ".") {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// isLiteral reports whether the constant key is initialised from literals alone.
func (m *mod) isLiteral(key string) bool {
	_, _, ok := m.literal(m.consts[key])
	return ok
}

// literal evaluates d when it is built of literals alone.
func (m *mod) literal(d *declared) (constant.Value, string, bool) {
	if d == nil {
		return nil, "", false
	}
	v, class, lit, ok := m.evalIn(d.f, d.expr, nil)
	return v, class, ok && lit
}

// eval evaluates d, following references to other constants of the module.
func (m *mod) eval(d *declared, seen map[string]bool) (constant.Value, string, bool) {
	if d == nil {
		return nil, "", false
	}
	v, class, _, ok := m.evalIn(d.f, d.expr, seen)
	return v, class, ok
}

var timeUnits = map[string]int64{"Nanosecond": 1, "Microsecond": 1e3, "Millisecond": 1e6, "Second": 1e9, "Minute": 60e9, "Hour": 3600e9}

// evalIn evaluates the constant expression e of file f: its value, its class, and whether it is
// built of literals alone (time units count as literals). With seen nil it follows no reference
// to another constant.
func (m *mod) evalIn(f *file, e ast.Expr, seen map[string]bool) (v constant.Value, class string, lit, ok bool) {
	ref := func(key string) (constant.Value, string, bool, bool) {
		d, found := m.consts[key]
		if seen == nil || !found || seen[key] {
			return nil, "", false, false
		}
		seen[key] = true
		defer delete(seen, key)
		v, class, _, ok := m.evalIn(d.f, d.expr, seen)
		return v, class, false, ok
	}
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind == token.INT || e.Kind == token.FLOAT || e.Kind == token.STRING {
			return constant.MakeFromLiteral(e.Value, e.Kind, 0), "number", true, true
		}
	case *ast.ParenExpr:
		return m.evalIn(f, e.X, seen)
	case *ast.Ident:
		return ref(f.dir + "." + e.Name)
	case *ast.SelectorExpr:
		x, isIdent := e.X.(*ast.Ident)
		if !isIdent {
			break
		}
		switch dir := f.imports[x.Name]; {
		case dir == "time":
			if n, unit := timeUnits[e.Sel.Name]; unit {
				return constant.MakeInt64(n), "duration", true, true
			}
		case dir != "":
			return ref(dir + "." + e.Sel.Name)
		}
	case *ast.UnaryExpr:
		if x, c, l, ok := m.evalIn(f, e.X, seen); ok && (e.Op == token.SUB || e.Op == token.ADD) {
			return constant.UnaryOp(e.Op, x, 0), c, l, true
		}
	case *ast.BinaryExpr:
		x, cx, lx, ok1 := m.evalIn(f, e.X, seen)
		y, cy, ly, ok2 := m.evalIn(f, e.Y, seen)
		if !ok1 || !ok2 || x.Kind() == constant.String || y.Kind() == constant.String {
			break
		}
		class := "number"
		if cx == "duration" || cy == "duration" {
			class = "duration"
		}
		switch op := e.Op; op {
		case token.SHL, token.SHR:
			s, exact := constant.Uint64Val(y)
			if exact {
				return constant.Shift(x, op, uint(s)), class, lx && ly, true
			}
		case token.ADD, token.SUB, token.MUL, token.QUO:
			if op == token.QUO && x.Kind() == constant.Int && y.Kind() == constant.Int {
				op = token.QUO_ASSIGN // integer division, as Go does for untyped integers
			}
			if constant.Sign(y) == 0 && e.Op == token.QUO {
				break
			}
			return constant.BinaryOp(x, op, y), class, lx && ly, true
		}
	case *ast.CallExpr: // a conversion: Duration(x), time.Duration(x), float64(x), …
		if len(e.Args) != 1 {
			break
		}
		var name string
		switch fn := e.Fun.(type) {
		case *ast.Ident:
			name = fn.Name
		case *ast.SelectorExpr:
			name = fn.Sel.Name
		}
		switch name {
		case "Duration", "float64", "int", "int64", "uint64":
			v, c, l, ok := m.evalIn(f, e.Args[0], seen)
			if name == "Duration" {
				c = "duration"
			}
			return v, c, l, ok
		}
	}
	return nil, "", false, false
}

// literalSites lists every maximal expression of the module built of numeric literals alone.
func (m *mod) literalSites() []site {
	if m.sites != nil {
		return m.sites
	}
	for _, f := range m.files {
		inits := map[ast.Expr]string{} // the values of package-level constants and variables
		for _, decl := range f.ast.Decls {
			if gd, ok := decl.(*ast.GenDecl); ok {
				for _, spec := range gd.Specs {
					if vs, ok := spec.(*ast.ValueSpec); ok {
						for i, v := range vs.Values {
							if i < len(vs.Names) {
								inits[v] = f.dir + "." + vs.Names[i].Name
							}
						}
					}
				}
			}
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			e, ok := n.(ast.Expr)
			if !ok {
				return true
			}
			v, class, lit, ok := m.evalIn(f, e, nil)
			if !ok || !lit {
				return true
			}
			if v.Kind() != constant.String {
				m.sites = append(m.sites, site{value: v, class: class, pos: m.fset.Position(e.Pos()), constant: inits[e]})
			}
			return false
		})
	}
	return m.sites
}

func positions(root string, ps []token.Position) string {
	var b strings.Builder
	for _, p := range ps {
		rel, err := filepath.Rel(root, p.Filename)
		if err != nil {
			rel = p.Filename
		}
		fmt.Fprintf(&b, "\n\t%s:%d", filepath.ToSlash(rel), p.Line)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
