package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardNamedArgsPointer: pgx takes a *pgx.NamedArgs as its QueryRewriter as it takes a
// pgx.NamedArgs (the pointer's method set holds RewriteQuery), and sends the same positional
// text. Judged by its own text, "where @everything" passed for a restriction ("@ column") and
// every row was written, on the pool, in a batch and through database/sql alike; each is
// refused now, as with the value.
func TestGuardNamedArgsPointer(t *testing.T) {
	p, dsn := openPool(t, "guards: {require_where: enforce}\n")
	ctx := context.Background()
	for _, tc := range []struct {
		sql  string
		args pgx.NamedArgs
	}{
		{"delete from items where @everything", pgx.NamedArgs{"everything": true}},
		{"update items set a = 1 where tenant_id = @tenant or @is_admin", pgx.NamedArgs{"tenant": 1, "is_admin": true}},
	} {
		for _, ptr := range []bool{false, true} {
			if _, err := p.Exec(ctx, "drop table if exists items; create table items (id int, tenant_id int, a int default 0); insert into items (id, tenant_id) select g, g % 3 from generate_series(1, 20) g"); err != nil {
				t.Fatal(err)
			}
			var arg any = tc.args
			if ptr {
				a := tc.args
				arg = &a
			}
			_, err := p.Exec(ctx, tc.sql, arg)
			var n, changed int
			if err := p.QueryRow(ctx, "select count(*), count(*) filter (where a <> 0) from items").Scan(&n, &changed); err != nil {
				t.Fatal(err)
			}
			t.Logf("pool ptr=%v %q: err=%v rows left %d, changed %d", ptr, tc.sql, err, n, changed)
			if !errors.Is(err, driver.ErrBlocked) || n != 20 || changed != 0 {
				t.Errorf("pool, pointer=%v: %q with %T: err %v, %d of 20 rows left, %d changed; want refused by require_where",
					ptr, tc.sql, arg, err, n, changed)
			}
		}
	}
	// In a batch.
	if _, err := p.Exec(ctx, "drop table if exists items; create table items (id int, tenant_id int, a int default 0); insert into items (id, tenant_id) select g, g % 3 from generate_series(1, 20) g"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("delete from items where @everything", &pgx.NamedArgs{"everything": true})
	br := p.SendBatch(ctx, b)
	_, berr := br.Exec()
	br.Close()
	var left int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&left); err != nil {
		t.Fatal(err)
	}
	t.Logf("batch ptr: err=%v rows left %d", berr, left)
	if !errors.Is(berr, driver.ErrBlocked) || left != 20 {
		t.Errorf("batch with *pgx.NamedArgs: err %v, %d of 20 rows left; want refused", berr, left)
	}
	// Through database/sql.
	db, err := driver.Open(dsn, driver.WithConfig(guardRules(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, ptr := range []bool{false, true} {
		if _, err := p.Exec(ctx, "drop table if exists items; create table items (id int, tenant_id int, a int default 0); insert into items (id, tenant_id) select g, g % 3 from generate_series(1, 20) g"); err != nil {
			t.Fatal(err)
		}
		na := pgx.NamedArgs{"everything": true}
		var arg any = na
		if ptr {
			arg = &na
		}
		_, err := db.ExecContext(ctx, "delete from items where @everything", arg)
		var n int
		if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil {
			t.Fatal(err)
		}
		t.Logf("database/sql ptr=%v: err=%v rows left %d", ptr, err, n)
		if !errors.Is(err, driver.ErrBlocked) || n != 20 {
			t.Errorf("database/sql, pointer=%v: err %v, %d of 20 rows left; want refused by require_where", ptr, err, n)
		}
	}
}
