package driver

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestDeeplyNestedStatementDoesNotCrashTheProcess: a statement whose parse tree is very deep
// (here a generated query of 50,000 UNION ALL branches, 950 KB; a long chain of `||` or `+` does
// the same) must not take the application down. pg_query's C code recurses on the thread's
// stack once or more per level of the tree, unchecked: on such a statement it overflowed it, and
// the process died with SIGSEGV (which no recover can catch) before anything was sent. As the
// design says of SQL pg_query cannot handle, the statement gets a hash fingerprint and goes to
// the server, which answers with its own error: pattern.Analyze gives pg_query no text nested
// more than 1,000 levels deep, and takes it for unparsable.
//
// The statement runs in a child process, so that a crash fails this test instead of the
// whole test binary.
func TestDeeplyNestedStatementDoesNotCrashTheProcess(t *testing.T) {
	const child = "PGTRAFFIC_DEEP_STATEMENT_CHILD"
	if os.Getenv(child) == "1" {
		h := newTelHarness(t, telRules) // a guard and budgets: every statement is analysed
		sql := "SELECT 1" + strings.Repeat(" UNION ALL SELECT 1", 50_000)
		ctx := tagging.With(context.Background(), "app", "web")
		if _, err := h.db.ExecContext(ctx, sql); err != nil {
			t.Logf("statement error (acceptable): %v", err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDeeplyNestedStatementDoesNotCrashTheProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), child+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		head := string(out)
		if i := strings.Index(head, "\ngoroutine "); i > 0 {
			head = head[:i]
		}
		t.Fatalf("a deeply nested statement killed the process (%v):\n%s", err, head)
	}
}
