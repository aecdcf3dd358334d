package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// The README (Rolling out a budget, max_duration): "enforce cancels it there, which a statement
// whose rows had all arrived does not notice: nothing is cut or counted, nor quarantined."
// ErrOverrun's documentation: the error of a statement "that ran past its budget's
// max_duration matches (errors.Is) ... : pgtraffic cancelled it on the server".
//
// A small query whose whole result (two rows, then the server's own error, or a row the
// application cannot scan) arrived at once, read by an application that works on each row for
// a while, so that it reads the end of the result after the budget's max_duration. Nothing is
// cancelled: the server had finished in microseconds. The error the application gets is the
// statement's own (division by zero, a NULL it cannot scan), not an overrun (matching neither
// ErrOverrun nor context.DeadlineExceeded, which retry-on-timeout code would retry), and the
// budget neither counts a max_duration block nor quarantines the cheap pattern (quarantine
// after: 1).
const lateErrorRules = `
budgets:
  - {name: b, mode: enforce, max_duration: 200ms, quarantine: {after: 1, for: 30s}}
rules:
  - {budget: b, match: {app: x}}
`

// wantNotAnOverrun asserts that err, the statement's own error, is not an overrun, and that the
// budget neither counted nor quarantined one.
func wantNotAnOverrun(t *testing.T, what string, err error, snap func() pgtdriver.Snapshot, wantState string) {
	t.Helper()
	var pe *pgconn.PgError
	if wantState != "" && (!errors.As(err, &pe) || pe.Code != wantState) {
		t.Fatalf("%s: error %v, want the server's SQLSTATE %s", what, err, wantState)
	}
	if err == nil {
		t.Fatalf("%s: no error", what)
	}
	if errors.Is(err, pgtdriver.ErrOverrun) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("%s: the statement's own error, read after max_duration from a result that had all arrived, is reported as an overrun: %q", what, err)
	}
	s := snap()
	b := budgetIn(s, "b")
	if n := b.BlockedBy[pgtdriver.ReasonMaxDuration]; n != 0 {
		t.Errorf("%s: budget counts %d max_duration blocks, want 0 (nothing was cut)", what, n)
	}
	if len(s.Quarantines) != 0 {
		t.Errorf("%s: the pattern was quarantined: %+v", what, s.Quarantines)
	}
}

func TestLateErrorNotAnOverrunSQL(t *testing.T) {
	c, db := openRules(t, lateErrorRules)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select 10 / (3 - g) from generate_series(1, 5) g" // two rows, then division by zero
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		n++
		time.Sleep(150 * time.Millisecond) // the application's work on each row
	}
	err = rows.Err()
	rows.Close()
	t.Logf("read %d rows; rows.Err: %v", n, err)
	wantNotAnOverrun(t, "database/sql rows", err, c.Snapshot, "22012")
	// The pattern still runs (it is cheap: the server answers it at once).
	rows, err = db.QueryContext(ctx, q)
	if err != nil {
		t.Errorf("the pattern afterwards: %v", err)
	} else {
		rows.Close()
	}
}

func TestLateErrorNotAnOverrunPool(t *testing.T) {
	ctx := pendingCtx
	t.Run("server error", func(t *testing.T) {
		p := pendingPool(t, 2, lateErrorRules)
		rows, err := p.Query(ctx, "select 10 / (3 - g) from generate_series(1, 5) g")
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for rows.Next() {
			n++
			time.Sleep(150 * time.Millisecond)
		}
		rows.Close()
		err = rows.Err()
		t.Logf("read %d rows; rows.Err: %v", n, err)
		wantNotAnOverrun(t, "pool rows, server error", err, p.Snapshot, "22012")
	})
	t.Run("scan error", func(t *testing.T) {
		p := pendingPool(t, 2, lateErrorRules)
		rows, err := p.Query(ctx, "select g, nullif(g, 3) from generate_series(1, 3) g") // NULL in row 3
		if err != nil {
			t.Fatal(err)
		}
		var scanErr error
		for rows.Next() {
			var a, b int
			if scanErr = rows.Scan(&a, &b); scanErr != nil {
				break
			}
			time.Sleep(150 * time.Millisecond)
		}
		rows.Close()
		err = rows.Err()
		t.Logf("Scan: %v; rows.Err: %v", scanErr, err)
		wantNotAnOverrun(t, "pool rows, scan error", err, p.Snapshot, "")
	})
	t.Run("queryrow scanned late", func(t *testing.T) {
		p := pendingPool(t, 2, lateErrorRules)
		row := p.QueryRow(ctx, "select nullif(1, 1)") // one NULL, answered at once
		time.Sleep(400 * time.Millisecond)            // the application does something else first
		var v int
		err := row.Scan(&v)
		t.Logf("Scan: %v", err)
		wantNotAnOverrun(t, "pool QueryRow scanned late", err, p.Snapshot, "")
	})
}

// budgetIn is budget name in s.
func budgetIn(s pgtdriver.Snapshot, name string) pgtdriver.BudgetStatus {
	for _, b := range s.Budgets {
		if b.Name == name {
			return b
		}
	}
	return pgtdriver.BudgetStatus{}
}
