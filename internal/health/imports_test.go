package health

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsNoDriver: the engine reads the health sample, so package health must stay free of
// database drivers and network clients (doc.go); the connection and the election are handed in.
// github.com/jackc/pgerrcode, PostgreSQL's table of SQLSTATE names and no driver, may be used.
func TestImportsNoDriver(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for dep := range strings.Lines(string(out)) {
		dep = strings.TrimSpace(dep)
		for _, banned := range []string{"github.com/jackc/pgx", "github.com/jackc/puddle", "github.com/redis/", "database/sql"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("package health depends on %s", dep)
			}
		}
	}
}
