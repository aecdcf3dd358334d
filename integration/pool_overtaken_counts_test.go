package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// runOvertaken runs one pool statement (or a batch of two) that is admitted before its
// connection on a pool of 2 whose connections are both taken, then overtaken by a query on a
// PoolConn (the budget's one slot), then given the second connection; during (the statement
// waiting in its re-admission, when the rules let it wait) is called before the test waits for
// its outcome. It returns the tallies' delta over the two statements (the overtaking query and the
// overtaken one), and the overtaken statement's outcome.
func runOvertaken(t *testing.T, rules string, batch bool, ctxTimeout time.Duration, during func(f *talliedEnd)) (tallyDelta, error) {
	t.Helper()
	_, ends := openTallied(t, rules, 2, "")
	f := ends[0]
	p := f.pool
	ctx := tagging.With(context.Background(), "app", "x")
	before := f.tally(t)
	c1, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := p.Raw().Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := sendInBackground(ctx, p, batch, ctxTimeout)
	pendingEventually(t, "the statement admitted, waiting for a connection", func() bool { return poolBudget(t, p, "b").InFlight == 1 })
	rows, err := c1.Query(ctx, "select generate_series(1, 3)") // overtakes the pending slot
	if err != nil {
		t.Fatal(err)
	}
	raw.Release()
	if during != nil {
		pendingEventually(t, "re-admission waits", func() bool {
			return poolBudget(t, p, "b").Waiting == 1 && p.Stat().AcquiredConns() == 2
		})
		during(f)
	}
	var out error
	select {
	case out = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the overtaken statement never ended")
	}
	rows.Close()
	c1.Release()
	poolHoldsNothing(t, p, "after the overtaken statement")
	return tallyDiff(f.tally(t), before), out
}

// TestPoolOvertakenRefusedCountedOnce: BudgetStatus's doc: "Admitted, Warned and Blocked
// count the statements the budget decided ..., one decision per statement, exactly as the
// pgtraffic.decisions metric counts them: Admitted ran with nothing to say (decision allow),
// ... Blocked were refused (decision block; a statement that waited under max_wait counts
// once)"; the only second decision documented is a run past max_duration. A pool statement
// admitted before its connection, overtaken while it waits for the pool, and refused once it
// has its connection (README: "decided again once it has its connection ... or be refused and
// give it back") never ran: it must count as one block, not as an allow and a block. Two
// statements run here (the overtaking query, which runs, and the overtaken one, refused), so the
// budget must count 1 allow and 1 block; the metric likewise. Refused at once (no max_wait),
// after waiting up to max_wait, and when its context ends while it waits; and a batch of two.
func TestPoolOvertakenRefusedCountedOnce(t *testing.T) {
	const noWait = `budgets: [{name: b, mode: enforce, max_concurrent: 1}]
rules: [{budget: b, match: {app: x}}]`
	const wait = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 300ms}]
rules: [{budget: b, match: {app: x}}]`
	const longWait = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`
	for _, tc := range []struct {
		name       string
		rules      string
		batch      bool
		ctxTimeout time.Duration
		statements int64 // the overtaken statements
	}{
		{"refused at once", noWait, false, 0, 1},
		{"refused after max_wait", wait, false, 0, 1},
		{"context ended while waiting", longWait, false, time.Second, 1},
		{"batch refused at once", noWait, true, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := runOvertaken(t, tc.rules, tc.batch, tc.ctxTimeout, nil)
			var be *driver.BlockedError
			if tc.ctxTimeout == 0 && !asBlockedOK(err, &be) {
				t.Fatalf("the overtaken statement: %v, want a refusal", err)
			}
			if tc.ctxTimeout > 0 && err == nil {
				t.Fatal("the overtaken statement ran; want its context's error")
			}
			want := map[string]int64{"b/allow/": 1, "b/block/concurrency": tc.statements}
			if fmt.Sprint(d.status) != fmt.Sprint(want) || fmt.Sprint(d.metricOf("b")) != fmt.Sprint(want) {
				t.Errorf("1 query ran and %d statement(s) overtaken and refused (%v): status counts %v, metric %v; want %v each "+
					"(one decision per statement; Admitted counts statements that ran)\n %s",
					tc.statements, err, d.status, d.metricOf("b"), want, d)
			}
		})
	}
}

func asBlockedOK(err error, be **driver.BlockedError) bool {
	return err != nil && errorsAs(err, be)
}

// TestPoolOvertakenReloadCountedOnce: BudgetStatus counts "one decision per statement". A pool
// statement overtaken while it waits for the pool waits in its re-admission (max_wait); the
// rules are replaced meanwhile, so it is decided again under them (README: "such a pool
// statement ... is decided again once it has its connection ..., and so is one whose rules were
// replaced meanwhile"). Two statements ran here (the overtaking query and it): 2 allows. When
// the new rules close the budget it is refused: 1 allow, 1 block.
func TestPoolOvertakenReloadCountedOnce(t *testing.T) {
	const start = `budgets: [{name: b, mode: enforce, max_concurrent: 1, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`
	for _, tc := range []struct {
		name, rules string
		refused     bool
		want        map[string]int64
	}{
		{"limit raised", `budgets: [{name: b, mode: enforce, max_concurrent: 5, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`, false, map[string]int64{"b/allow/": 2}},
		{"budget closed", `budgets: [{name: b, mode: enforce, max_concurrent: 0, max_wait: 30s}]
rules: [{budget: b, match: {app: x}}]`, true, map[string]int64{"b/allow/": 1, "b/block/concurrency": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := runOvertaken(t, start, false, 0, func(f *talliedEnd) { f.setConfig(t, tc.rules) })
			if (err != nil) != tc.refused {
				t.Fatalf("the overtaken statement: %v (want refused: %v)", err, tc.refused)
			}
			if fmt.Sprint(d.status) != fmt.Sprint(tc.want) || fmt.Sprint(d.metricOf("b")) != fmt.Sprint(tc.want) {
				t.Errorf("status counts %v, metric %v; want %v each (one decision per statement)\n %s", d.status, d.metricOf("b"), tc.want, d)
			}
		})
	}
}

// sendInBackground runs on p, in a goroutine, "select 1" or (batch) a batch of "select 1" and
// "select 2", under ctx bounded by timeout (0: none), and sends its outcome on the channel it
// returns.
func sendInBackground(ctx context.Context, p *driver.Pool, batch bool, timeout time.Duration) <-chan error {
	res := make(chan error, 1)
	go func() {
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		if batch {
			b := &pgx.Batch{}
			b.Queue("select 1")
			b.Queue("select 2")
			res <- p.SendBatch(ctx, b).Close()
			return
		}
		_, err := p.Exec(ctx, "select 1")
		res <- err
	}()
	return res
}
