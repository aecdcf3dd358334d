package integration

import (
	"context"
	"database/sql"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// guardGapWhere are WHERE clauses that a naive require_where check lets through: each is
// true for every row of t, so with the guard enforced pgtraffic must refuse the DELETE or UPDATE
// before it reaches the server.
var guardGapWhere = []string{
	`coalesce(true, false)`,
	`(SELECT true)`,
	`EXISTS (SELECT 1)`,
	`'a' LIKE '%'`,
	`1 BETWEEN 0 AND 2`,
	`1 = ANY('{1}'::int[])`,
	`CASE WHEN true THEN true END`,
	`(1, 2) = (1, 2)`,
	`'a' < 'b'`,
	`1 = 1.0::float8`,
	`10 % 3 = 1`,
	`length('') = 0`,
	`true::text::bool`,
	`current_user = current_user`,
	`t.id = id`,
	`id + 0 = id`,
	`id::int = id::int`,
	`id IS NOT NULL OR id IS NULL`,
	// More of the same families.
	`EXISTS (SELECT 1 FROM u)`,
	`EXISTS (SELECT 1 FROM u WHERE t.id = t.id)`,
	`NOT (id = 5 AND false)`,
	`(id = id) = true`,
	`id = 5 OR true`,
	`id - id = 0`,
	`lower(status) = lower(status) OR status IS NULL`,
	`uid < 5 OR uid >= 5 OR uid IS NULL`,
	`now() > '2000-01-01'`,
}

// TestGuardGapsLoseNoRow runs each gap as a DELETE and as an UPDATE: pgtraffic refuses it with
// the guard's reason, raw pgx shows (in a transaction rolled back) that it would have written
// every row, and the table keeps every row.
func TestGuardGapsLoseNoRow(t *testing.T) {
	raw, db, _ := openBoth(t, driver.WithConfig(guardRules(t)))
	ctx := context.Background()
	const rows = 20
	if _, err := db.ExecContext(ctx, `
		create table u (id int primary key);
		insert into u values (1), (2);
		create table t (id int primary key, uid int references u, status text, tenant_id int, deleted_at timestamptz);
		insert into t select g, 1 + g % 2, 'new', g % 3, null from generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	for _, where := range guardGapWhere {
		for _, stmt := range []string{
			`DELETE FROM t WHERE ` + where,
			`UPDATE t SET status = 'lost' WHERE ` + where,
		} {
			t.Run(stmt, func(t *testing.T) {
				if n := wouldWrite(t, raw, "", stmt); n != rows {
					t.Fatalf("raw pgx: %d rows written, want all %d (the case does not test a gap)", n, rows)
				}
				_, err := db.ExecContext(ctx, stmt)
				if be := asBlocked(t, err); be.Reason != driver.ReasonGuard || be.Rule != "require_where" {
					t.Errorf("blocked by %+v, want the require_where guard", be)
				}
			})
		}
	}
	// Unparsable by pg_query, run by the server: with standard_conforming_strings off, '\''
	// is a quote inside a string, so this WHERE is '''' = '''' and true for every row.
	t.Run("unparsable", func(t *testing.T) {
		const stmt = `DELETE FROM t WHERE '\'' = ''''`
		const setting = `SET LOCAL standard_conforming_strings = off`
		if n := wouldWrite(t, raw, setting, stmt); n != rows {
			t.Fatalf("raw pgx: %d rows written, want all %d", n, rows)
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
		if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
			t.Errorf("blocked by %+v, want a guard", be)
		}
		if _, err := c.ExecContext(ctx, `RESET standard_conforming_strings`); err != nil {
			t.Fatal(err)
		}
	})
	assertRows(t, db, rows, 0)

	// What applications send still runs, and writes only what it names.
	for _, tc := range []struct {
		stmt string
		args []any
		n    int64
	}{
		{`UPDATE t SET deleted_at = now() WHERE t.id = $1 AND t.deleted_at IS NULL`, []any{5}, 1}, // GORM soft delete
		{`UPDATE "t" SET "status"=$1 WHERE "t"."id" = $2`, []any{"seen", 6}, 1},
		{`UPDATE t AS x SET status = 'seen' WHERE (x.id = 7)`, nil, 1},
		{`UPDATE t SET status = 'seen' WHERE status = 'new' AND id > $1`, []any{17}, 3},
		{`UPDATE t SET status = 'seen' WHERE id IN (1, 2)`, nil, 2},
		{`UPDATE t SET status = 'seen' WHERE id = ANY($1)`, []any{[]int32{3, 4}}, 2},
		{`UPDATE t SET status = 'tenant' WHERE tenant_id = current_setting('app.tenant', true)::int`, nil, 0},
		{`UPDATE t SET status = 'orphan' WHERE NOT EXISTS (SELECT 1 FROM u WHERE u.id = t.uid)`, nil, 0},
		{`UPDATE t SET status = 'u1' WHERE EXISTS (SELECT 1 FROM u WHERE u.id = t.uid AND u.id = 1)`, nil, 10},
		{`UPDATE t SET status = 'max' WHERE id = (SELECT max(id) FROM u)`, nil, 1},
		{`UPDATE t SET status = 'none' WHERE 1 = 0`, nil, 0},
		{`DELETE FROM t WHERE deleted_at IS NOT NULL`, nil, 1},
		{`DELETE FROM t WHERE id = $1`, []any{20}, 1},
	} {
		res, err := db.ExecContext(ctx, tc.stmt, tc.args...)
		if err != nil {
			t.Errorf("%s: %v", tc.stmt, err)
			continue
		}
		if n, _ := res.RowsAffected(); n != tc.n {
			t.Errorf("%s: %d rows, want %d", tc.stmt, n, tc.n)
		}
	}
	assertRows(t, db, rows-2, 0)
}

func guardRules(t *testing.T) *driver.Config {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte("guards:\n  require_where: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// wouldWrite runs stmt through raw pgx in a transaction (after setting, if not "") and rolls it
// back, returning the rows it wrote.
func wouldWrite(t *testing.T, raw *sql.DB, setting, stmt string) int64 {
	t.Helper()
	tx, err := raw.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if setting != "" {
		if _, err := tx.Exec(setting); err != nil {
			t.Fatal(err)
		}
	}
	res, err := tx.Exec(stmt)
	if err != nil {
		t.Fatalf("raw pgx: %s: %v", stmt, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// assertRows checks that t has n rows and lost statuses none of them.
func assertRows(t *testing.T, db *sql.DB, n, lost int) {
	t.Helper()
	var got, gotLost int
	if err := db.QueryRow(`select count(*), count(*) filter (where status = 'lost') from t`).Scan(&got, &gotLost); err != nil {
		t.Fatal(err)
	}
	if got != n || gotLost != lost {
		t.Fatalf("t has %d rows (%d lost), want %d (%d lost)", got, gotLost, n, lost)
	}
}
