package integration

import (
	"context"
	"errors"
	"testing"
	"time"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// Probes on the pool, by per_query_limit (150ms): a pattern that ran 400ms once is refused as
// never fitting; its probe, a QueryRow that is in fact cheap, lets it back in; another
// pattern's probe, in a transaction and still costly, is cut at the limit (well under its
// 400ms), matches ErrOverrun, ends the transaction (documented), leaves nothing in flight or
// acquired, and the pattern stays refused.
func TestOverrunProbePool(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, per_query_limit: 150ms}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	const cheap, costly = "select pg_sleep($1::float8)::text", "select pg_sleep($1::float8)::text, 2"
	var s string
	var n int
	for _, q := range []string{cheap, costly} {
		if q == cheap {
			if err := p.QueryRow(ctx, q, 0.4).Scan(&s); err != nil {
				t.Fatalf("%s first: %v", q, err)
			}
		} else if err := p.QueryRow(ctx, q, 0.4).Scan(&s, &n); err != nil {
			t.Fatalf("%s first: %v", q, err)
		}
	}
	neverFits := func(err error) bool {
		var b *pgtdriver.BlockedError
		return errors.As(err, &b) && b.Reason == pgtdriver.ReasonPerQuery && b.RetryAfter == 0
	}
	if err := p.QueryRow(ctx, cheap, 0).Scan(&s); !neverFits(err) {
		t.Fatalf("cheap after 400ms: %v, want refused as never fitting", err)
	}
	deadline := time.Now().Add(4 * cost.Relearn)
	var cheapBack, costlyCut bool
	for !(cheapBack && costlyCut) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if !cheapBack {
			switch err := p.QueryRow(ctx, cheap, 0).Scan(&s); {
			case err == nil:
				cheapBack = true
				for i := range 3 {
					if err := p.QueryRow(ctx, cheap, 0).Scan(&s); err != nil {
						t.Fatalf("cheap %d after its probe: %v", i, err)
					}
				}
			case !errors.Is(err, pgtdriver.ErrBlocked):
				t.Fatalf("cheap: %v", err)
			}
		}
		if !costlyCut {
			tx, err := p.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			err = tx.QueryRow(ctx, costly, 0.4).Scan(&s, &n)
			took := time.Since(t0)
			switch {
			case err == nil:
				tx.Rollback(context.Background())
				t.Fatal("the costly probe ran to its end")
			case errors.Is(err, pgtdriver.ErrOverrun):
				costlyCut = true
				if took > 350*time.Millisecond {
					t.Errorf("the probe was cut after %v, its bound is 150ms", took)
				}
				_, err2 := tx.Exec(ctx, "select 1")
				t.Logf("probe cut after %v; the tx's next statement: %v", took, err2)
				tx.Rollback(context.Background())
				if err := p.QueryRow(ctx, costly, 0).Scan(&s, &n); !neverFits(err) {
					t.Errorf("costly after its probe was cut: %v, want refused as never fitting", err)
				}
			case errors.Is(err, pgtdriver.ErrBlocked):
				// A refusal leaves the transaction usable.
				if _, err := tx.Exec(ctx, "select 1"); err != nil {
					t.Errorf("the tx after a refusal: %v", err)
				}
				tx.Rollback(context.Background())
			default:
				tx.Rollback(context.Background())
				t.Fatalf("costly: %v", err)
			}
		}
	}
	if !cheapBack || !costlyCut {
		t.Fatalf("cheap back %v, costly cut %v", cheapBack, costlyCut)
	}
	rvIdle(t, p, "b")
	if n := p.Snapshot().Counters.Probes; n < 2 {
		t.Errorf("probes counted %d", n)
	}
	t.Logf("budget: blocked %v", poolBudget(t, p, "b").BlockedBy)
}
