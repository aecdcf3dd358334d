package integration

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestQueueWaitKeepsItsTurnAcrossReload: README step 4: "Under a budget with `max_wait`,
// `Wait` waits its turn in the budget's queue among the statements (arrival order, as long as
// its `ctx` allows) and passes when it is first with room"; CHANGELOG (Unreleased): after a
// reload, a waiting statement or batch "rejoins in its place of arrival", and "Every waiter is
// now decided again at once".
//
// A batch job calls Wait first; a statement arrives after it; an unrelated reload (a budget
// added, as a deploy does) comes while both wait; then the slot is freed. Wait is first in
// arrival order, so it must pass as soon as the slot frees (taking nothing), before the
// statement's 1 s run ends. Today Wait, told the rules changed, checks again as a new
// waiter (engine.Wait: check makes a fresh Exec, whose Waiter has no arrival) and joins at
// the back, behind the statement that came after it: it passes only once that statement has
// run (3 s). A statement in its place keeps it across the same reload.
func TestQueueWaitKeepsItsTurnAcrossReload(t *testing.T) {
	const before = `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 30s, max_queue: 4}
rules:
  - {budget: q, match: {app: job}}
`
	const after = `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 30s, max_queue: 4}
  - {name: other, mode: enforce, max_concurrent: 5}
rules:
  - {budget: q, match: {app: job}}
  - {budget: other, match: {app: unrelated}}
`
	type frontEnd struct {
		wait    func(context.Context) error
		hold    func(context.Context) (func(), error)
		exec    func(context.Context, string) error
		waiting func() int
		reload  func(string)
	}
	cfgOf := func(rules string) *driver.Config {
		cfg, err := driver.ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	fronts := map[string]func(t *testing.T) frontEnd{
		"Open": func(t *testing.T) frontEnd {
			c, db := openRules(t, before)
			db.SetMaxOpenConns(8)
			return frontEnd{wait: c.Wait,
				hold: func(ctx context.Context) (func(), error) {
					rows, err := db.QueryContext(ctx, "select 1")
					if err != nil {
						return nil, err
					}
					return func() { rows.Close() }, nil
				},
				exec:    func(ctx context.Context, q string) error { _, err := db.ExecContext(ctx, q); return err },
				waiting: func() int { return budgetStatus(t, c, "q").Waiting },
				reload: func(r string) {
					if err := c.SetConfig(cfgOf(r)); err != nil {
						t.Fatal(err)
					}
				}}
		},
		"NewPool": func(t *testing.T) frontEnd {
			p, _ := openPool(t, before)
			return frontEnd{wait: p.Wait,
				hold: func(ctx context.Context) (func(), error) {
					rows, err := p.Query(ctx, "select 1")
					return rows.Close, err
				},
				exec:    func(ctx context.Context, q string) error { _, err := p.Exec(ctx, q); return err },
				waiting: func() int { return poolBudget(t, p, "q").Waiting },
				reload: func(r string) {
					if err := p.SetConfig(cfgOf(r)); err != nil {
						t.Fatal(err)
					}
				}}
		},
	}
	for _, name := range []string{"Open", "NewPool"} {
		t.Run(name, func(t *testing.T) {
			fe := fronts[name](t)
			ctx := tagging.With(context.Background(), "app", "job")
			// Warm the statement's pattern, so that it is decided without an EXPLAIN.
			if err := fe.exec(ctx, "select pg_sleep(0.01)"); err != nil {
				t.Fatal(err)
			}
			release, err := fe.hold(ctx)
			if err != nil {
				t.Fatal(err)
			}
			type event struct {
				who string
				err error
				at  time.Time
			}
			events := make(chan event, 2)
			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			go func() { err := fe.wait(waitCtx); events <- event{"Wait passed", err, time.Now()} }()
			if !eventually(5*time.Second, func() bool { return fe.waiting() == 1 }) {
				t.Fatal("Wait did not queue")
			}
			go func() { err := fe.exec(ctx, "select pg_sleep(3)"); events <- event{"statement ended", err, time.Now()} }()
			if !eventually(5*time.Second, func() bool { return fe.waiting() == 2 }) {
				t.Fatal("the statement did not queue")
			}
			fe.reload(after)
			time.Sleep(300 * time.Millisecond)
			release()
			got := map[string]event{}
			for range 2 {
				e := <-events
				if e.err != nil {
					t.Fatalf("%s: %v", e.who, e.err)
				}
				got[e.who] = e
			}
			// In its turn, Wait passes at the release, the statement's 3 s run after it.
			if lead := got["statement ended"].at.Sub(got["Wait passed"].at); lead < time.Second {
				t.Errorf("after an unrelated reload, Wait (first to arrive) passed only %v before the statement that "+
					"arrived after it ended: the statement ran first", lead)
			}
		})
	}
}
