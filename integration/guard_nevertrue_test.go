package integration

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardNeverTrueIsSound: require_where admits a write whose condition it proves never true
// (x <> x), so that proof may only take a column, a parameter or a literal for the same value
// on both sides. A volatile call or a lossy cast makes each of these conditions true for every
// row: pgtraffic must refuse the write, and the table keeps every row.
func TestGuardNeverTrueIsSound(t *testing.T) {
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
	for _, where := range []string{
		`gen_random_uuid() <> gen_random_uuid()`, // volatile: two calls, two values
		`random() <> random()`,
		`0.5 <> 0.5::int`,      // a lossy cast: 0.5 <> 1
		`now() <> now()::date`, // true except at midnight
	} {
		for _, stmt := range []string{
			`DELETE FROM t WHERE ` + where,
			`UPDATE t SET status = 'lost' WHERE ` + where,
		} {
			t.Run(stmt, func(t *testing.T) {
				if n := wouldWrite(t, raw, "", stmt); n != rows {
					t.Fatalf("raw pgx: %d rows written, want all %d (the case does not test a gap)", n, rows)
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback() // keep the table for the next case whatever happens
				res, err := tx.ExecContext(ctx, stmt)
				if err == nil {
					n, _ := res.RowsAffected()
					t.Fatalf("admitted under require_where: enforce, wrote %d of %d rows", n, rows)
				}
				if be := asBlocked(t, err); be.Reason != driver.ReasonGuard || be.Rule != "require_where" {
					t.Errorf("blocked by %+v, want the require_where guard", be)
				}
			})
		}
	}
	assertRows(t, db, rows, 0)
}
