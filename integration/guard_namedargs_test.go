package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardNamedArgs: pgx.NamedArgs is a QueryRewriter: pgx sends @name as $n. Judged before
// the rewrite, pg_query reads @name as the prefix operator @ (absolute value) applied to a
// column of the target, and a condition that is only a parameter (refused as WHERE $1) passed
// for a restriction of the target's rows. The engine decides the text pgx sends: each
// statement below, which writes every row when run, is refused, alone or in a batch.
func TestGuardNamedArgs(t *testing.T) {
	p, _ := openPool(t, "guards: {require_where: enforce}\n")
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int, tenant_id int, a int default 0)"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		sql  string
		args pgx.NamedArgs
	}{
		{"delete from items where @everything", pgx.NamedArgs{"everything": true}},
		{"update items set a = 1 where tenant_id = @tenant or @is_admin", pgx.NamedArgs{"tenant": 1, "is_admin": true}},
		// The usual optional filter: a NULL tenant means "all tenants".
		{"delete from items where @tenant::int is null or tenant_id = @tenant", pgx.NamedArgs{"tenant": nil}},
	} {
		t.Run(tc.sql, func(t *testing.T) {
			if _, err := p.Exec(ctx, "truncate items; insert into items (id, tenant_id) select g, g % 3 from generate_series(1, 20) g"); err != nil {
				t.Fatal(err)
			}
			_, err := p.Exec(ctx, tc.sql, tc.args)
			var n, changed int
			if err := p.QueryRow(ctx, "select count(*), count(*) filter (where a <> 0) from items").Scan(&n, &changed); err != nil {
				t.Fatal(err)
			}
			if err == nil {
				t.Errorf("admitted with require_where enforced: items has %d of 20 rows, %d updated", n, changed)
			} else if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
				t.Errorf("blocked by %+v, want a guard", be)
			}
		})
	}
	b := &pgx.Batch{}
	b.Queue("delete from items where @everything", pgx.NamedArgs{"everything": true})
	br := p.SendBatch(ctx, b)
	_, err := br.Exec()
	br.Close()
	var n int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if err == nil || n != 20 {
		t.Errorf("a batch's named-argument delete: %v, items has %d of 20 rows; want refused", err, n)
	}
	// Control: the positional spelling is refused.
	if _, err := p.Exec(ctx, "delete from items where $1::int is null or tenant_id = $1", nil); err == nil {
		t.Errorf("positional optional filter admitted, want refused")
	}
}
