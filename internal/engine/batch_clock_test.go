package engine

import (
	"context"
	"math"
	"testing"
	"time"
)

// TestBatchServerClockCharges: a batch's hold is charged the predictions of the statements it
// holds when those are on the server's clock, whatever clock a statement no budget of it
// selects is on; otherwise the batch's time, which, while the server's clock is read, the
// reports of its statements' patterns true up to what the server spent on each, split evenly
// between the statements.
func TestBatchServerClockCharges(t *testing.T) {
	e, clk := newEngine(t, `
server_cores: 1
budgets:
  - {name: r, mode: enforce, server_share: 0.000001, burst_limit: 1000s}
rules:
  - {budget: r, match: {table: t}}
`)
	ctx := context.Background()
	debt := func() float64 {
		for _, b := range e.Budgets() {
			return b.Snapshot.Debt
		}
		return 0
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-6 }
	step := func(what string, want float64, f func()) {
		t.Helper()
		before := debt()
		f()
		if got := debt() - before; !near(got, want) {
			t.Fatalf("%s: the debt moved by %v, want %v", what, got, want)
		}
	}
	identified := func(q string, id int64) uint64 {
		p, _ := e.patterns.Get(q)
		e.model.PutQueryID(p.FingerprintID, p.Normalized, id)
		return p.FingerprintID
	}
	report := func(fp uint64, id int64, seconds float64) func() {
		return func() {
			if e.ObserveServer(fp, id, seconds, clk.Now().Add(time.Minute)) != nil {
				t.Fatal("the report was not taken")
			}
		}
	}
	failedBatch := func(took time.Duration, err error, queries ...string) func() {
		return func() {
			var b Batch
			if err := e.BeginBatch(ctx, &b, nil, queries, nil); err != nil {
				t.Fatal(err)
			}
			clk.Advance(took)
			errs := make([]error, len(queries))
			errs[len(errs)-1] = err
			b.Finish(ctx, errs)
		}
	}
	batch := func(took time.Duration, queries ...string) func() { return failedBatch(took, nil, queries...) }
	const (
		lookup = "select v from t where id = $1"
		other  = "select w from t where k = $1"
		free   = "select 1"
	)
	fpLookup, fpOther := identified(lookup, 1), identified(other, 2)
	e.Reading(clk.Now().Add(time.Hour), time.Second)

	step("three lookups before their pattern's first report", 0.3, batch(300*time.Millisecond, lookup, lookup, lookup))
	step("the lookups' first report", 3*0.01-0.3, report(fpLookup, 1, 0.01))
	step("two lookups on the server's clock, beside a statement no budget holds", 2*0.01,
		batch(300*time.Millisecond, lookup, free, lookup))

	// The server reports no statement that failed or was cancelled: as a statement's, a failed
	// batch's charge is at least what it took on the client's clock.
	step("two lookups on the server's clock, cancelled after 300ms", 0.3,
		failedBatch(300*time.Millisecond, context.Canceled, lookup, lookup))
	step("two lookups on the server's clock, failed at once", 2*0.01,
		failedBatch(time.Millisecond, context.Canceled, lookup, lookup))

	step("a lookup and another pattern before its first report", 0.4, batch(400*time.Millisecond, lookup, other))
	step("the other pattern's first report: its half of the batch's time trued up", 0.02-0.2, report(fpOther, 2, 0.02))
	step("the lookups' next report: their half trued up", 0.01-0.2, report(fpLookup, 1, 0.01))
}
