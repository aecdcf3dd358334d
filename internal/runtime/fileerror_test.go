package runtime

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// TestRulesFileErrorSaysPgtrafficOnce: a rules file that does not parse is refused with an
// error that names the file and the problem's line and field, prefixed once ("pgtraffic: rules
// file …: rules line 3: …", not "…: pgtraffic: rules line 3: …"), and that still matches
// rules.ErrInvalid.
func TestRulesFileErrorSaysPgtrafficOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("budgets:\n  - name: a\n    max_concurent: 4\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r, _ := newRuntime(t, "")
	err := r.WatchFile(path, 0)
	if err == nil {
		t.Fatal("a rules file with an unknown field was accepted")
	}
	msg := err.Error()
	if strings.Count(msg, "pgtraffic:") != 1 || !strings.HasPrefix(msg, "pgtraffic: rules file "+path+": rules line 3: ") {
		t.Errorf("error %q: want it prefixed once, naming the file and the line", msg)
	}
	if !errors.Is(err, rules.ErrInvalid) {
		t.Errorf("error %v does not match rules.ErrInvalid", err)
	}
}
