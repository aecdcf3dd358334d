package integration

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// pgxSuiteDir is the package that pgx's suite runs in: on disk it holds only the functions the
// suite is redirected to (pgtraffic_test.go); TestPgxStdlibSuite adds the suite's files.
const pgxSuiteDir = "testdata/pgxsuite"

// pgxSuiteRedirects are the textual rewrites of pgx's external test files (package
// stdlib_test: its tests and benchmarks) that make every database they open a pgtraffic one
// under an enforce budget (see pgxSuiteDir). Each must apply at least once, so that a new pgx
// cannot make the suite run around pgtraffic unnoticed. pgx's internal tests (package stdlib)
// test its unexported code, open no database, and are left out.
var pgxSuiteRedirects = []struct{ old, new string }{
	{"stdlib.OpenDB(", "pgtrafficOpenDB(t, "},
	{`sql.Open("pgx", `, "pgtrafficSQLOpen(t, "},
	// pgtraffic's connection is not a *stdlib.Conn; it has the same Conn method (driver.RawConn).
	{".(*stdlib.Conn).Conn()", ".(interface{ Conn() *pgx.Conn }).Conn()"},
}

// pgxSuiteSkips are the tests of the suite that cannot apply to a driver wrapping pgx's, each
// with the reason. Every other test runs, through pgtraffic.
var pgxSuiteSkips = map[string]string{
	"TestSQLOpen":            `opens the driver names "pgx" and "pgx/v5" on purpose: pgx's registration, not pgtraffic's`,
	"TestSQLOpenFromPool":    "stdlib.OpenDBFromPool serves a *pgxpool.Pool's connections; pgtraffic's connectors open their own",
	"TestRegisterConnConfig": `stdlib.RegisterConnConfig names a config for sql.Open("pgx", ...) only; pgtraffic takes one directly (driver.NewConnectorFromConfig)`,
	"TestOptionBeforeAfterConnect": "counts its hooks' calls, exactly two, in variables it does not synchronise: pgtraffic's server clock reader " +
		"and health sampler connect through the same hooks (so that a password set per connection reaches them), from goroutines of their own",
}

// externalTest matches the package clause of pgx's external test files.
var externalTest = regexp.MustCompile(`(?m)^package stdlib_test$`)

// TestPgxStdlibSuite runs pgx's own database/sql test suite, that of the pgx in go.mod (from
// the module cache), through pgtraffic. The module cache cannot be overlaid, so the suite runs
// as package pgxSuiteDir: go test -overlay adds to it copies of pgx's external test files
// rewritten by pgxSuiteRedirects, and -modfile a go.mod that requires testify. The shim there
// opens each database through pgtraffic with every statement under an enforce budget that
// never blocks, and fails a test whose budget warned about or refused anything; this test
// fails if nothing went through the budget. Nothing of pgx is committed here. It takes about
// 15 seconds once built.
func TestPgxStdlibSuite(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	pgxDir := moduleDir(t, "github.com/jackc/pgx/v5")
	work := t.TempDir()
	pkgDir, err := filepath.Abs(pgxSuiteDir)
	if err != nil {
		t.Fatal(err)
	}
	replace := map[string]string{}
	applied := make([]int, len(pgxSuiteRedirects))
	files, err := filepath.Glob(filepath.Join(pgxDir, "stdlib", "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		src, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !externalTest.Match(src) {
			continue
		}
		name := filepath.Base(file)
		out, counts := redirectPgxSuite(src)
		for i, n := range counts {
			applied[i] += n
		}
		path := filepath.Join(work, name)
		if err := os.WriteFile(path, out, 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(pkgDir, name)] = path
	}
	for i, n := range applied {
		if n == 0 {
			t.Fatalf("pgx's suite has no %q left to redirect: see pgxSuiteRedirects", pgxSuiteRedirects[i].old)
		}
	}
	overlay, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlayPath := filepath.Join(work, "overlay.json")
	if err := os.WriteFile(overlayPath, overlay, 0o644); err != nil {
		t.Fatal(err)
	}
	// pgx's tests import testify, which pgtraffic does not require: a copy of go.mod does.
	modFile := filepath.Join(work, "go.mod")
	for _, f := range []string{"go.mod", "go.sum"} {
		data, err := os.ReadFile(filepath.Join("..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(work, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	testify := "github.com/stretchr/testify@" + moduleVersion(t, "github.com/stretchr/testify")
	if out, err := exec.Command("go", "mod", "edit", "-modfile", modFile, "-require", testify).CombinedOutput(); err != nil {
		t.Fatalf("go mod edit: %v\n%s", err, out)
	}

	args := []string{"test", "-json", "-count=1", "-timeout=10m", "-modfile", modFile, "-overlay", overlayPath,
		"-skip", pgxSuiteSkipPattern()}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "./"+pgxSuiteDir)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "PGX_TEST_DATABASE="+dsn)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, runErr := cmd.Output()
	r, err := readTestEvents(stdout)
	if err != nil {
		t.Fatalf("go test -json: %v\n%s", err, stderr.String())
	}
	for _, name := range r.failed {
		t.Errorf("pgx's %s failed through pgtraffic:\n%s", name, r.output[name])
	}
	for name, reason := range pgxSuiteSkips {
		t.Logf("skipped %s: %s", name, reason)
	}
	for _, name := range r.skipped {
		t.Logf("skipped by pgx: %s", strings.TrimSpace(r.output[name]))
	}
	t.Logf("pgx's stdlib suite through pgtraffic: %d tests ran (%d subtests), %d passed, %d skipped by pgx, %d failed; %d skipped here; "+
		"%d databases opened, whose budget admitted %d statements (%d EXPLAINs)",
		r.ran, r.subtests, r.passed, len(r.skipped), len(r.failed), len(pgxSuiteSkips), r.databases, r.admitted, r.explained)
	if runErr != nil && len(r.failed) == 0 {
		t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), runErr, r.other, stderr.String())
	}
	if r.passed == 0 || r.admitted == 0 {
		t.Fatalf("no test of pgx's suite passed, or no statement went through the budget\n%s%s", r.other, stderr.String())
	}
}

// redirectPgxSuite applies pgxSuiteRedirects to a test file of pgx's suite, and returns how
// many times each applied.
func redirectPgxSuite(src []byte) ([]byte, []int) {
	s := string(src)
	counts := make([]int, len(pgxSuiteRedirects))
	for i, r := range pgxSuiteRedirects {
		counts[i] = strings.Count(s, r.old)
		s = strings.ReplaceAll(s, r.old, r.new)
	}
	if strings.Contains(s, `"github.com/jackc/pgx/v5/stdlib"`) && !strings.Contains(s, "stdlib.") {
		s += "\nvar _ = stdlib.OpenDB // the import's only use was redirected to pgtraffic\n"
	}
	return []byte(s), counts
}

// pgxSuiteSkipPattern is go test's -skip for pgxSuiteSkips.
func pgxSuiteSkipPattern() string {
	names := make([]string, 0, len(pgxSuiteSkips))
	for name := range pgxSuiteSkips {
		names = append(names, regexp.QuoteMeta(name))
	}
	slices.Sort(names)
	return "^(" + strings.Join(names, "|") + ")$"
}

// moduleDir returns the directory of module path (the version in go.mod), downloading it if
// need be.
func moduleDir(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", path).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", path, err)
	}
	var m struct{ Dir, Error string }
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("go mod download %s: %v", path, err)
	}
	if m.Error != "" || m.Dir == "" {
		t.Fatalf("go mod download %s: no directory: %s", path, m.Error)
	}
	return m.Dir
}

// moduleVersion returns the version of module path in the module graph.
func moduleVersion(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", path).Output()
	if err != nil {
		t.Fatalf("go list -m %s: %v", path, err)
	}
	return strings.TrimSpace(string(out))
}

// admittedLine is the shim's log line at the end of a test: what one database's budget admitted.
var admittedLine = regexp.MustCompile(`pgtraffic budget: admitted (\d+), explained (\d+)`)

// testEvents is what readTestEvents gathers from go test -json: counts of top-level tests,
// the failed and skipped ones by name with their output, the output of no test, and the
// databases the shim opened with the statements their budgets admitted.
type testEvents struct {
	ran, passed, subtests int
	databases             int
	admitted, explained   int
	failed, skipped       []string
	output                map[string]string
	other                 string
}

func readTestEvents(stream []byte) (testEvents, error) {
	r := testEvents{output: map[string]string{}}
	var other strings.Builder
	dec := json.NewDecoder(bytes.NewReader(stream))
	for dec.More() {
		var e struct{ Action, Test, Output string }
		if err := dec.Decode(&e); err != nil {
			return r, err
		}
		if e.Test == "" {
			other.WriteString(e.Output)
			continue
		}
		top, _, sub := strings.Cut(e.Test, "/")
		switch e.Action {
		case "output":
			r.output[top] += e.Output
			if m := admittedLine.FindStringSubmatch(e.Output); m != nil {
				admitted, err1 := strconv.Atoi(m[1])
				explained, err2 := strconv.Atoi(m[2])
				if err := errors.Join(err1, err2); err != nil {
					return r, err
				}
				r.databases++
				r.admitted += admitted
				r.explained += explained
			}
		case "run":
			if sub {
				r.subtests++
			} else {
				r.ran++
			}
		case "pass":
			if !sub {
				r.passed++
			}
		case "skip":
			if !sub {
				r.skipped = append(r.skipped, top)
			}
		case "fail":
			if !sub {
				r.failed = append(r.failed, top)
			}
		}
	}
	r.other = other.String()
	return r, nil
}

func TestRedirectPgxSuite(t *testing.T) {
	const stdlibImport = "import \"github.com/jackc/pgx/v5/stdlib\"\n"
	for _, tt := range []struct {
		name, src, want string
		counts          []int
	}{
		{"open", "db := stdlib.OpenDB(*config, opts...)", "db := pgtrafficOpenDB(t, *config, opts...)", []int{1, 0, 0}},
		{"from pool is left", "db := stdlib.OpenDBFromPool(pool)", "db := stdlib.OpenDBFromPool(pool)", []int{0, 0, 0}},
		{"sql.Open", `db, err := sql.Open("pgx", dsn)`, "db, err := pgtrafficSQLOpen(t, dsn)", []int{0, 1, 0}},
		{"other driver name is left", `sql.Open(tt.driverName, dsn)`, `sql.Open(tt.driverName, dsn)`, []int{0, 0, 0}},
		{"raw conn", "c := dc.(*stdlib.Conn).Conn()", "c := dc.(interface{ Conn() *pgx.Conn }).Conn()", []int{0, 0, 1}},
		{"import kept in use", stdlibImport + "db := stdlib.OpenDB(*config)",
			stdlibImport + "db := pgtrafficOpenDB(t, *config)\nvar _ = stdlib.OpenDB // the import's only use was redirected to pgtraffic\n",
			[]int{1, 0, 0}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, counts := redirectPgxSuite([]byte(tt.src))
			if string(got) != tt.want || !slices.Equal(counts, tt.counts) {
				t.Errorf("redirectPgxSuite(%q) = %q, %v; want %q, %v", tt.src, got, counts, tt.want, tt.counts)
			}
		})
	}
}
