package facts

import (
	"go/ast"
	"go/constant"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// pkg is one package of the module as go list describes it.
type pkg struct {
	path    string   // relative to the module: "driver/rules"
	imports []string // the packages it imports itself
	deps    []string // every package it imports, directly or not
}

// listModule describes every package of the module but the examples (nested modules aside).
func listModule(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}}|{{join .Imports \",\"}}|{{join .Deps \",\"}}", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string]pkg{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Split(line, "|")
		if len(fields) != 3 {
			t.Fatalf("go list printed %q", line)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(fields[0], module), "/")
		if strings.HasPrefix(rel, "examples/") {
			continue
		}
		pkgs[rel] = pkg{path: rel, imports: split(fields[1]), deps: split(fields[2])}
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// ours reports whether import path p is a package of the module, and its path within it.
func ours(p string) (string, bool) {
	rel, ok := strings.CutPrefix(p, module+"/")
	return rel, ok
}

// Library and layering rules of the module's packages: each package imports only what its
// layer may. A rule names the packages it covers by path prefix.
var layerRules = []struct {
	name string
	// covers reports whether the rule applies to package rel.
	covers func(rel string) bool
	// allowed reports whether a package covered may depend on dep (an import path), directly
	// or not.
	allowed func(dep string) bool
}{
	{
		name:   "the public config imports nothing under internal/ and no Redis client",
		covers: func(rel string) bool { return rel == "driver/rules" || strings.HasPrefix(rel, "driver/rules/") },
		allowed: func(dep string) bool {
			rel, mine := ours(dep)
			return !(mine && strings.HasPrefix(rel, "internal/")) && !strings.HasPrefix(dep, "github.com/redis/")
		},
	},
	{
		name:   "the vocabulary is a leaf: the standard library only",
		covers: func(rel string) bool { return rel == "driver/rules/vocab" },
		allowed: func(dep string) bool {
			return !strings.Contains(strings.Split(dep, "/")[0], ".")
		},
	},
	{
		name:   "the engine decides: it imports no file watcher, Redis client or PostgreSQL driver",
		covers: func(rel string) bool { return rel == "internal/engine" },
		allowed: func(dep string) bool {
			return !strings.HasPrefix(dep, "github.com/fsnotify/") && !strings.HasPrefix(dep, "github.com/redis/") &&
				!pgDriver(dep)
		},
	},
	{
		name: "the background readers take their connections handed in: no PostgreSQL driver or Redis client",
		covers: func(rel string) bool {
			return rel == "internal/health" || rel == "internal/serverclock"
		},
		allowed: func(dep string) bool {
			return !strings.HasPrefix(dep, "github.com/redis/") && !pgDriver(dep)
		},
	},
	{
		name:   "the budget core imports nothing of ours but the vocabulary, and no YAML or network library",
		covers: func(rel string) bool { return rel == "internal/budget" },
		allowed: func(dep string) bool {
			if rel, mine := ours(dep); mine {
				return rel == "driver/rules/vocab"
			}
			return !strings.Contains(strings.Split(dep, "/")[0], ".")
		},
	},
}

// TestLayers: the import rules of the design hold for every package they cover, counting what
// a package imports through others.
func TestLayers(t *testing.T) {
	pkgs := listModule(t)
	for _, rule := range layerRules {
		t.Run(rule.name, func(t *testing.T) {
			covered := 0
			for _, rel := range sortedKeys(pkgs) {
				if !rule.covers(rel) {
					continue
				}
				covered++
				for _, dep := range pkgs[rel].deps {
					if !rule.allowed(dep) {
						t.Errorf("%s imports %s%s", rel, dep, through(pkgs, rel, dep))
					}
				}
			}
			if covered == 0 {
				t.Fatal("the rule covers no package: renamed?")
			}
		})
	}
}

// TestOneFrontEndImportsTheSQLDriver: only the database/sql front end imports
// database/sql/driver and pgx's stdlib.
func TestOneFrontEndImportsTheSQLDriver(t *testing.T) {
	pkgs := listModule(t)
	for _, rel := range sortedKeys(pkgs) {
		for _, imp := range pkgs[rel].imports {
			if (imp == "database/sql/driver" || imp == "github.com/jackc/pgx/v5/stdlib") && rel != "driver" {
				t.Errorf("%s imports %s", rel, imp)
			}
		}
	}
}

// through names the package of the module by which rel reaches dep, when not directly.
func through(pkgs map[string]pkg, rel, dep string) string {
	if slices.Contains(pkgs[rel].imports, dep) {
		return ""
	}
	for _, imp := range pkgs[rel].imports {
		if r, mine := ours(imp); mine && (imp == dep || slices.Contains(pkgs[r].deps, dep)) {
			return " (through " + r + ")"
		}
	}
	return ""
}

// pgDriver reports whether dep is pgx or one of its parts: github.com/jackc/ but for pgerrcode,
// PostgreSQL's table of SQLSTATE names, which drives nothing.
func pgDriver(dep string) bool {
	return strings.HasPrefix(dep, "github.com/jackc/") && dep != "github.com/jackc/pgerrcode"
}

// libraries are the words a package's documentation names a library it imports by, per import
// path prefix; an import of another library fails TestDocNamesImports until it is added here.
var libraries = []struct{ prefix, word string }{
	{"github.com/jackc/pgx/", "pgx"},
	{"github.com/jackc/pgerrcode", "pgerrcode"},
	{"github.com/jackc/puddle/", "puddle"},
	{"github.com/redis/go-redis/", "go-redis"},
	{"github.com/fsnotify/fsnotify", "fsnotify"},
	{"github.com/pganalyze/pg_query_go/", "pg_query_go"},
	{"google.golang.org/protobuf/", "protobuf"},
	{"go.yaml.in/yaml/", "YAML"},
	{"go.opentelemetry.io/otel", "OpenTelemetry"},
}

// TestDocNamesImports: each package's doc.go says which packages it may import, and what it
// imports is among them: every package of the module it imports directly is named by its path
// in the module (internal/budget, driver/rules/vocab), and every library by its word
// (libraries). So a package that starts importing something its documentation does not allow
// fails here, and so does documentation that forgets an import.
func TestDocNamesImports(t *testing.T) {
	pkgs := listModule(t)
	for _, rel := range sortedKeys(pkgs) {
		dir := rel
		if dir == "" {
			dir = "."
		}
		doc, err := os.ReadFile(filepath.Join("../..", dir, "doc.go")) // the module root, from this package
		if err != nil {
			t.Errorf("%s: no doc.go saying what the package does and what it may import: %v", rel, err)
			continue
		}
		for _, imp := range pkgs[rel].imports {
			if !strings.Contains(strings.Split(imp, "/")[0], ".") {
				continue // the standard library
			}
			if dep, mine := ours(imp); mine {
				if !namesPath(string(doc), dep) {
					t.Errorf("%s imports %s, which its doc.go does not name", rel, dep)
				}
				continue
			}
			i := slices.IndexFunc(libraries, func(l struct{ prefix, word string }) bool { return strings.HasPrefix(imp, l.prefix) })
			switch {
			case i < 0:
				t.Errorf("%s imports %s, a library this test does not know: add it to libraries and to the package's doc.go", rel, imp)
			case !strings.Contains(string(doc), libraries[i].word):
				t.Errorf("%s imports %s, which its doc.go does not name (%s)", rel, imp, libraries[i].word)
			}
		}
	}
}

// namesPath reports whether doc names path as a whole: internal/cost, not as the start of
// internal/cost/pgxexplain.
func namesPath(doc, path string) bool {
	for rest := doc; ; {
		i := strings.Index(rest, path)
		if i < 0 {
			return false
		}
		before, after := byte(' '), byte(' ')
		if i > 0 {
			before = rest[i-1]
		}
		if j := i + len(path); j < len(rest) {
			after = rest[j]
		}
		if !pathChar(before) && !pathChar(after) {
			return true
		}
		rest = rest[i+len(path):]
	}
}

func pathChar(c byte) bool {
	return c == '/' || c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

// TestFieldNamesAreFields: the rules file's field names that the vocabulary holds for the layers
// below the config (vocab's Field and Guard constants, quoted in refusals' limits) are fields of
// the rules config, as its yaml struct tags spell them: a field renamed in one place and not the
// other fails here.
func TestFieldNamesAreFields(t *testing.T) {
	m := load(t)
	tags := map[string]bool{}
	for _, f := range m.files {
		if f.dir != "driver/rules" {
			continue
		}
		ast.Inspect(f.ast, func(n ast.Node) bool {
			if field, ok := n.(*ast.Field); ok && field.Tag != nil {
				tag, _ := strconv.Unquote(field.Tag.Value)
				name, _, _ := strings.Cut(reflect.StructTag(tag).Get("yaml"), ",")
				tags[name] = true
			}
			return true
		})
	}
	checked := 0
	for key := range m.consts {
		dir, name, _ := strings.Cut(key, ".")
		if dir != "driver/rules/vocab" || !strings.HasPrefix(name, "Field") && !strings.HasPrefix(name, "Guard") {
			continue
		}
		checked++
		v, _, ok := m.eval(m.consts[key], map[string]bool{})
		if !ok || v.Kind() != constant.String {
			t.Errorf("vocab.%s is not a string constant", name)
			continue
		}
		if s := constant.StringVal(v); !tags[s] {
			t.Errorf("vocab.%s = %q is no field of the rules config (no yaml tag of driver/rules spells it)", name, s)
		}
	}
	if checked == 0 {
		t.Fatal("no Field or Guard constant in driver/rules/vocab: renamed?")
	}
}
