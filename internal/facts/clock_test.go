package facts

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestOneFakeClock: the tests of every package take their fake time from internal/fakeclock.
// A method Now() time.Time declared in any other test file of the repository (nested modules
// included) is a second fake clock.
func TestOneFakeClock(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var clocks []string
	tests := 0
	err = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (n == "testdata" || strings.HasPrefix(n, ".") || strings.HasPrefix(n, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		tests++
		af, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range af.Decls {
			if fd, ok := decl.(*ast.FuncDecl); ok && fd.Recv != nil && isNow(fd.Name, fd.Type) {
				clocks = append(clocks, fset.Position(fd.Pos()).String())
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if tests < 50 {
		t.Fatalf("only %d test files under %s", tests, root)
	}
	for _, c := range clocks {
		t.Errorf("%s: a fake clock of its own; use internal/fakeclock", strings.TrimPrefix(c, root+string(filepath.Separator)))
	}
}

// isNow reports whether a method is Now() time.Time.
func isNow(name *ast.Ident, ft *ast.FuncType) bool {
	if name.Name != "Now" || ft.Params.NumFields() != 0 || ft.Results.NumFields() != 1 {
		return false
	}
	sel, ok := ft.Results.List[0].Type.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Time"
}
