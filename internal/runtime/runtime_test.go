package runtime

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestReloadHoldsNoLockAcrossCompile: while one SetConfig is provably inside its compile (held
// there by the clock, which the compile reads), every reader of the runtime answers and another
// SetConfig installs its rules: the runtime's lock is never held across a compile. The first
// reload, started before the second, then finds itself superseded and leaves the second's
// rules in force.
func TestReloadHoldsNoLockAcrossCompile(t *testing.T) {
	clk := fakeclock.New()
	var armed atomic.Bool
	inCompile, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	r, _ := newRuntime(t, "budgets:\n  - {name: a, max_concurrent: 1}\n", func(o *engine.Options) {
		o.Now = func() time.Time {
			if armed.CompareAndSwap(true, false) {
				close(inCompile)
				<-release
			}
			return clk.Now()
		}
	})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	slow, err := rules.Parse([]byte("budgets:\n  - {name: slow, max_concurrent: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	fast, err := rules.Parse([]byte("budgets:\n  - {name: fast, max_concurrent: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	reloaded := make(chan error, 1)
	go func() { reloaded <- r.SetConfig(slow) }()
	<-inCompile

	done := make(chan error, 1)
	go func() {
		r.Budgets()
		r.Coordination()
		r.Instance()
		r.Health()
		done <- r.SetConfig(fast)
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second): // a watchdog only: they return at once when right
		t.Fatal("a reader or another reload waited for a reload's compile")
	}
	releaseOnce.Do(func() { close(release) })
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if b := r.Budgets(); len(b) != 1 || b[0].Name != "fast" {
		t.Fatalf("budgets in force %+v, want the later SetConfig's (fast)", b)
	}
}

// TestReloadHoldsNoLockAcrossRedis: Redis is stopped (SIGSTOP) once the coordinator has a
// lease. A reload that removes the coordination section, which makes its coordinator say
// goodbye to Redis (up to closeWithin), does not hold the runtime's lock while it waits: ten
// rounds of readers answer before the reload returns.
func TestReloadHoldsNoLockAcrossRedis(t *testing.T) {
	srv := redistest.Need(t)
	local := "budgets:\n  - {name: a, mode: enforce, max_concurrent: 4}\nrules:\n  - {budget: a, match: {statement: select}}\n"
	r, _ := newRuntime(t, "coordination: {redis: \""+srv.URL+"\", sync_interval: 100ms}\n"+local,
		func(o *engine.Options) { o.Now, o.After = time.Now, time.After })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if x, err := begin(r.e, context.Background(), "select 1"); err == nil {
			x.Finish(context.Background(), nil) // a partition to sync
		}
		if st := r.Coordination(); len(st) == 1 && st[0].Syncs > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sync with Redis in 10s: %+v", r.Coordination())
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	cfg, err := rules.Parse([]byte(local))
	if err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan error, 1)
	go func() { reloaded <- r.SetConfig(cfg) }()
	// Readers that waited for the goodbye would each return only once the reload is done.
	for rounds := range 10 {
		r.Budgets()
		r.Coordination()
		r.Instance()
		select {
		case err := <-reloaded:
			t.Fatalf("the reload (%v) ended before %d rounds of readers: they waited for its goodbye to Redis", err, rounds+1)
		default:
		}
	}
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if st := r.Coordination(); st != nil {
		t.Fatalf("still coordinating after the section was removed: %+v", st)
	}
}

// TestSetConfigKeepsACopy: SetConfig keeps a copy of the Config it is given, so that a caller
// that goes on changing its own (to prepare the next reload) changes nothing in force, and does
// not race with the statements that read the rules. Here a caller adds a health threshold
// (in_flight above 0, which throttles every statement) and retargets the rule in its own
// Config after handing it over: statements are still decided by the rules it handed over.
func TestSetConfigKeepsACopy(t *testing.T) {
	r, _ := newRuntime(t, "")
	cfg, err := rules.Parse([]byte(`
budgets:
  - {name: q, mode: enforce, max_concurrent: 2, throttle_when: {in_flight: 100}}
rules:
  - {budget: q, match: {app: q}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	cfg.Budgets[0].ThrottleWhen[rules.MetricInFlight] = 0
	cfg.Rules[0].Match["app"] = "other"
	*cfg.Budgets[0].MaxConcurrent = 0

	ctx := tagging.With(context.Background(), "app", "q")
	x, err := begin(r.e, ctx, "select 1")
	if err != nil {
		t.Fatalf("a statement refused by changes made to the caller's Config after SetConfig: %v", err)
	}
	defer x.Finish(ctx, nil)
	if len(x.Budgets) != 1 || x.Budgets[0] != "q" {
		t.Fatalf("budgets %v; want [q], as routed by the Config handed over", x.Budgets)
	}
	// With one statement in flight, the in_flight threshold added to the caller's Config would
	// throttle the next; the limit in force is the Config's as handed over: 2 at once.
	y, err := begin(r.e, ctx, "select 1")
	if err != nil {
		t.Fatalf("second statement under max_concurrent 2: %v", err)
	}
	defer y.Finish(ctx, nil)
	if _, err := begin(r.e, ctx, "select 1"); err == nil {
		t.Fatal("a third statement admitted under max_concurrent 2")
	}
}
