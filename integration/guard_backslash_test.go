package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardBackslashQuoteHidesNoWrite: with standard_conforming_strings off, a backslash before a
// quote ends a string elsewhere for the server than for pg_query, which always reads strings
// with it on: a DELETE or TRUNCATE that pg_query takes for string content, or that Key would
// strip as a trailing "--" comment, is run by the server. The guards must refuse each text and
// the table keep its rows; a backslash before no quote changes no statement, and a restricted
// DELETE with one still runs.
func TestGuardBackslashQuoteHidesNoWrite(t *testing.T) {
	cfg, err := driver.ParseConfig([]byte("guards:\n  require_where: enforce\n  block_truncate: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}
	raw, db, _ := openBoth(t, driver.WithConfig(cfg))
	ctx := context.Background()
	for _, stmt := range []string{
		`SELECT '\'' ; DELETE FROM t; --'`, // pg_query: one string literal
		`SELECT '\' -- '; DELETE FROM t`,   // Key: a trailing comment, stripped
		`SELECT '\'' ; TRUNCATE t; --'`,    // block_truncate, same gap
	} {
		t.Run(stmt, func(t *testing.T) {
			if _, err := raw.ExecContext(ctx, `drop table if exists t; create table t (id int); insert into t select generate_series(1, 20)`); err != nil {
				t.Fatal(err)
			}
			c, err := db.Conn(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.ExecContext(ctx, `SET standard_conforming_strings = off`); err != nil {
				t.Fatal(err)
			}
			_, err = c.ExecContext(ctx, stmt)
			c.ExecContext(ctx, `RESET standard_conforming_strings`)
			var n int
			if err := raw.QueryRowContext(ctx, `select count(*) from t`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 20 {
				t.Errorf("guards enforced, yet t lost %d of 20 rows (statement error: %v)", 20-n, err)
			}
			if err == nil {
				t.Errorf("admitted, want refused by a guard")
			} else if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
				t.Errorf("blocked by %+v, want a guard", be)
			}
		})
	}
	t.Run("restricted writes still run", func(t *testing.T) {
		if _, err := raw.ExecContext(ctx, `drop table if exists t; create table t (id int); insert into t select generate_series(1, 20)`); err != nil {
			t.Fatal(err)
		}
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		defer c.ExecContext(ctx, `RESET standard_conforming_strings`)
		id := 0 // each statement deletes the next row
		for _, setting := range []string{"on", "off"} {
			if _, err := c.ExecContext(ctx, `SET standard_conforming_strings = `+setting); err != nil {
				t.Fatal(err)
			}
			for _, stmt := range []string{
				`DELETE FROM t WHERE id = $1 AND 'C:\dir' <> '' -- c`,
				`DELETE FROM t WHERE id = $1 AND E'it\'s' <> ''`,
			} {
				id++
				res, err := c.ExecContext(ctx, stmt, id)
				if err != nil {
					t.Fatalf("standard_conforming_strings %s: %s: %v", setting, stmt, err)
				}
				if n, _ := res.RowsAffected(); n != 1 {
					t.Errorf("standard_conforming_strings %s: %s: %d rows, want 1", setting, stmt, n)
				}
			}
		}
	})
}
