package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// guardAgainstServer runs stmt through pgtraffic (require_where and block_truncate enforced) on a
// fresh t of 20 rows, after SET standard_conforming_strings = setting, and asserts that it is
// refused by a guard and that t keeps its 20 rows with a = 0.
func guardAgainstServer(t *testing.T, setting, stmt string) {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte("guards:\n  require_where: enforce\n  block_truncate: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}
	raw, db, _ := openBoth(t, driver.WithConfig(cfg))
	ctx := context.Background()
	if _, err := raw.ExecContext(ctx, `create table t (id int, a int default 0); insert into t (id) select generate_series(1, 20)`); err != nil {
		t.Fatal(err)
	}
	c, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, `SET standard_conforming_strings = `+setting); err != nil {
		t.Fatal(err)
	}
	_, err = c.ExecContext(ctx, stmt)
	var n, changed int
	if err := raw.QueryRowContext(ctx, `select count(*), count(*) filter (where a <> 0) from t`).Scan(&n, &changed); err != nil {
		t.Fatal(err)
	}
	if n != 20 || changed != 0 {
		t.Errorf("guards enforced, yet the server ran it: t has %d of 20 rows, %d updated (statement error: %v)", n, changed, err)
	}
	if err == nil {
		t.Errorf("%q admitted, want refused by a guard", stmt)
	} else if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
		t.Errorf("blocked by %+v, want a guard", be)
	}
}

// TestGuardCarriageReturnComment: the server ends a "--" comment at \r as at \n; Key
// strips to \n only, so the write after the \r is never seen by the guard.
func TestGuardCarriageReturnComment(t *testing.T) {
	for _, stmt := range []string{
		"-- cleanup job\rDELETE FROM t",
		"DELETE FROM t WHERE id = 1 -- c\r OR true",
		"UPDATE t SET a = 1 WHERE id = 1 -- c\r OR true",
	} {
		t.Run(stmt, func(t *testing.T) { guardAgainstServer(t, "on", stmt) })
	}
}

// TestGuardUnparsedQuotedKeyword: with standard_conforming_strings off (the setting the
// backslash handling exists for), an unrestricted UPDATE right after a string or comment whose
// last word is key, for or do is taken for FOR [NO KEY] UPDATE / DO UPDATE and admitted.
func TestGuardUnparsedQuotedKeyword(t *testing.T) {
	for _, stmt := range []string{
		`SELECT 'it\'s the key'; UPDATE t SET a = 1`,
		`SELECT '\'' , 'do' ; UPDATE t SET a = 1; --'`,
		`SELECT '\'' ; /* for */ UPDATE t SET a = 1; --'`,
	} {
		t.Run(stmt, func(t *testing.T) { guardAgainstServer(t, "off", stmt) })
	}
}

// TestGuardControl: the same harness refuses what the guard already catches (so a
// failure above is the gap, not the harness).
func TestGuardControl(t *testing.T) {
	for _, stmt := range []string{
		"-- cleanup job\r\nDELETE FROM t",
		"DELETE FROM t WHERE id = 1 -- c\n OR true",
		"SELECT 1; UPDATE t SET a = 1",
	} {
		t.Run(stmt, func(t *testing.T) { guardAgainstServer(t, "on", stmt) })
	}
	t.Run("off", func(t *testing.T) { guardAgainstServer(t, "off", `SELECT 'it\'s'; UPDATE t SET a = 1`) })
}
