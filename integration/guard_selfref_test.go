package integration

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardTargetListedAgain: a write that lists its target's relation again (DELETE ...
// USING t AS t2, UPDATE ... FROM t AS t2, MERGE ... USING t, a subquery over t) pairs every
// row with itself, so a condition each row meets with itself writes every row: the
// de-duplication without its t.id > t2.id deleted the whole table, as did four other forms,
// unrefused. Each statement is run through raw pgx (rolled back) to count what it writes: one
// that writes every row is refused, one that writes some runs, the de-duplication itself
// included.
func TestGuardTargetListedAgain(t *testing.T) {
	raw, db, _ := openBoth(t, driver.WithConfig(guardRules(t)))
	if _, err := raw.Exec(`create table t (id int primary key, email text not null, parent_id int,
		archived bool not null default false);
		insert into t select g, 'u' || (g % 5) || '@x', nullif(g / 2, 0), g % 4 = 0 from generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stmt    string
		refused bool
	}{
		{`DELETE FROM t USING t AS t2 WHERE t.email = t2.email`, true},
		{`DELETE FROM t USING t AS t2 WHERE t.id = t2.id`, true},
		{`UPDATE t SET email = 'x' FROM t AS t2 WHERE t.id = t2.id`, true},
		{`MERGE INTO t USING t AS s ON t.id = s.id WHEN MATCHED THEN DELETE`, true},
		{`DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS t2 WHERE t2.id = t.id)`, true},
		{`DELETE FROM t WHERE id IN (SELECT id FROM t)`, true},
		{`DELETE FROM t USING t AS t2 WHERE t.email = t2.email AND t.id > t2.id`, false},
		{`DELETE FROM t USING t AS t2 WHERE t.parent_id = t2.id`, false},
		{`DELETE FROM t USING t AS t2 WHERE t.id = t2.id AND t2.archived`, false},
		{`MERGE INTO t USING t AS s ON t.id = s.id WHEN MATCHED AND s.archived THEN DELETE`, false},
		{`DELETE FROM t WHERE EXISTS (SELECT 1 FROM t AS c WHERE c.parent_id = t.id)`, false},
		{`DELETE FROM t WHERE id NOT IN (SELECT min(id) FROM t GROUP BY email)`, false},
	} {
		n := wouldWrite(t, raw, "", tc.stmt)
		if all := n == 20; all != tc.refused {
			t.Fatalf("raw pgx: %s wrote %d of 20 rows: the case is wrong", tc.stmt, n)
		}
		if refused := guardRefuses(t, db, tc.stmt); refused != tc.refused {
			t.Errorf("%s (writes %d of 20 rows): refused %v, want %v", tc.stmt, n, refused, tc.refused)
		}
	}
}

// guardRefuses reports whether a guard refuses stmt on db, run in a transaction rolled back.
func guardRefuses(t *testing.T, db *sql.DB, stmt string) bool {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(context.Background(), stmt)
	var be *driver.BlockedError
	if errors.As(err, &be) {
		return be.Reason == driver.ReasonGuard
	}
	if err != nil {
		t.Fatalf("%s: %v", stmt, err)
	}
	return false
}
