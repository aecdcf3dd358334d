package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// clock is a settable fake clock with fake timers: nothing in these tests waits in real time.
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func newEngine(t testing.TB, rulesText string, o ...func(*Options)) (*Engine, *fakeclock.Clock) {
	t.Helper()
	clk := fakeclock.New()
	opts := Options{Logger: quiet, Now: clk.Now, After: clk.After, User: "app", Database: "shop"}
	for _, f := range o {
		f(&opts)
	}
	e := New(opts)
	if rulesText != "" {
		reload(t, e, rulesText)
	}
	return e, clk
}

// reload puts rulesText in force in e as a reload does (setConfig), failing the test when it
// does not parse or compile.
func reload(t testing.TB, e *Engine, rulesText string) {
	t.Helper()
	cfg, err := rules.Parse([]byte(rulesText))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
}

// setConfig puts cfg in force as the runtime does: Compile, then Install.
func (e *Engine) setConfig(cfg *rules.Config) error {
	r, err := e.Compile(cfg)
	if err != nil {
		return err
	}
	e.Install(r)
	return nil
}

// run begins a statement and, if admitted, finishes it after d of fake time.
func run(e *Engine, clk *fakeclock.Clock, ctx context.Context, query string, d time.Duration) error {
	x, err := begin(e, ctx, query)
	if err != nil {
		return err
	}
	clk.Advance(d)
	x.Finish(ctx, nil)
	return nil
}

func denial(t *testing.T, err error) *Denial {
	t.Helper()
	var d *Denial
	if !errors.As(err, &d) {
		t.Fatalf("want a *Denial, got %v", err)
	}
	return d
}

func TestTagsMerged(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, "", func(o *Options) {
		o.Observer = obs
		o.ApplicationName = "api"
	})
	ctx := tagging.With(context.Background(), "route", "/ctx", "tenant", "t1")
	x, err := begin(e, ctx, "select * from orders o join items i on i.o = o.id /*route='%2Fcomment',controller='pay'*/")
	if err != nil {
		t.Fatal(err)
	}
	x.Finish(ctx, nil)
	want := map[string][]string{
		"username": {"app"}, "database": {"shop"}, "application_name": {"api"},
		"statement": {"select"}, "table": {"items", "orders"},
		"route": {"/ctx"}, "tenant": {"t1"}, "controller": {"pay"},
	}
	m := map[string][]string{}
	for _, kv := range obs.tags {
		m[kv.Key] = append(m[kv.Key], kv.Value)
	}
	for k, v := range want {
		if fmt.Sprint(m[k]) != fmt.Sprint(v) {
			t.Errorf("tag %s = %v, want %v", k, m[k], v)
		}
	}
	if len(m["fingerprint"]) != 1 || len(m["fingerprint"][0]) != 16 {
		t.Errorf("fingerprint tag %v", m["fingerprint"])
	}
}

func TestNoRulesAllowsEverything(t *testing.T) {
	e, clk := newEngine(t, "")
	for _, q := range []string{"select 1", "delete from t", "not sql at all", ""} {
		if err := run(e, clk, context.Background(), q, time.Millisecond); err != nil {
			t.Fatalf("%q: %v", q, err)
		}
	}
	if e.InFlight() != 0 {
		t.Fatalf("in flight %d", e.InFlight())
	}
}

func TestConcurrencyAllOrNothing(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 2}
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
  - {budget: b, match: {app: x, kind: heavy}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	heavy := tagging.With(ctx, "kind", "heavy")
	x1, err := begin(e, heavy, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	// b is full: the heavy statement is refused and takes nothing from a.
	_, err = begin(e, heavy, "select 1")
	if d := denial(t, err); d.Budget != "b" || d.Reason != vocab.ReasonConcurrency || d.Rule != "app=x,kind=heavy" || d.RetryAfter <= 0 {
		t.Fatalf("denial %+v", d)
	}
	if bs := e.Budgets()[0]; bs.InFlight != 1 {
		t.Fatalf("budget a in flight %d after a denied admission; want 1", bs.InFlight)
	}
	x2, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := begin(e, ctx, "select 1"); denial(t, err).Budget != "a" {
		t.Fatal("a should be full")
	}
	x1.Finish(ctx, nil)
	x2.Finish(ctx, nil)
	for _, bs := range e.Budgets() {
		if bs.InFlight != 0 {
			t.Fatalf("%s leaked: %+v", bs.Name, bs)
		}
	}
}

func TestBucketWithHistoryPredictor(t *testing.T) {
	e, clk := newEngine(t, `
server_cores: 2
budgets:
  - {name: r, mode: enforce, server_share: 0.25, burst_limit: 1s}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	q := "select count(*) from events" // no connection: history is the predictor
	// Each run costs 300ms of actual time; the bucket (1s, drains 0.5 s/s) is trued up to it.
	admitted := 0
	var d *Denial
	for range 10 {
		err := run(e, clk, ctx, q, 300*time.Millisecond)
		if err != nil {
			d = denial(t, err)
			break
		}
		admitted++
	}
	if d == nil || d.Reason != vocab.ReasonBudget || d.RetryAfter <= 0 {
		t.Fatalf("bucket never blocked; admitted %d, denial %+v", admitted, d)
	}
	clk.Advance(d.RetryAfter)
	if err := run(e, clk, ctx, q, 300*time.Millisecond); err != nil {
		t.Fatalf("after RetryAfter: %v", err)
	}
}

func TestWarnModeAdmits(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: w, max_concurrent: 1}
rules:
  - {budget: w, match: {app: w}}
`)
	ctx := tagging.With(context.Background(), "app", "w")
	x1, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	x2, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatalf("warn mode blocked: %v", err)
	}
	if x2.Decision != DecisionWarn || x2.Reason != vocab.ReasonConcurrency {
		t.Fatalf("decision %s/%s", x2.Decision, x2.Reason)
	}
	x1.Finish(ctx, nil)
	x2.Finish(ctx, nil)
	if e.Stats().Warned.Load() != 1 || e.Budgets()[0].InFlight != 0 {
		t.Fatalf("warned %d, budget %+v", e.Stats().Warned.Load(), e.Budgets()[0])
	}
}

func TestOffModeIgnored(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: o, mode: off, max_concurrent: 1}
rules:
  - {budget: o, match: {app: o}}
`)
	ctx := tagging.With(context.Background(), "app", "o")
	for range 3 {
		if _, err := begin(e, ctx, "select 1"); err != nil {
			t.Fatal(err)
		}
	}
}

func TestGuards(t *testing.T) {
	e, clk := newEngine(t, `
guards:
  require_where: enforce
  block_truncate: {mode: enforce, match: {app: web}}
`)
	ctx := context.Background()
	web := tagging.With(ctx, "app", "web")
	cases := []struct {
		ctx   context.Context
		q     string
		block string
	}{
		{ctx, "delete from t", vocab.GuardRequireWhere},
		{ctx, "update t set a = 1 where 1 = 1", vocab.GuardRequireWhere},
		{ctx, "delete from t where id = $1", ""},
		{WithGuardBypass(ctx), "delete from t", ""},
		{ctx, "delete from t /* pgtraffic_bypass='true' */", vocab.GuardRequireWhere},
		{web, "truncate t", vocab.GuardBlockTruncate},
		{ctx, "truncate t", ""}, // the truncate guard is scoped to app=web
	}
	for _, tc := range cases {
		err := run(e, clk, tc.ctx, tc.q, time.Millisecond)
		if tc.block == "" {
			if err != nil {
				t.Errorf("%q: %v", tc.q, err)
			}
			continue
		}
		if d := denial(t, err); d.Reason != vocab.ReasonGuard || d.Rule != tc.block {
			t.Errorf("%q: %+v", tc.q, d)
		}
	}
}

// TestMaxWait: a statement refused for a slot waits for it under max_wait and is admitted the
// moment one is released (no clock advance, no polling); one still refused when its max_wait
// ends is refused then, and not before; a context that ends stops the wait with its error.
func TestMaxWait(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 2s}
rules:
  - {budget: q, match: {app: q}}
`)
	ctx := tagging.With(context.Background(), "app", "q")
	x1, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		x2, err := begin(e, ctx, "select 1")
		if err == nil {
			x2.Finish(ctx, nil)
		}
		done <- err
	}()
	waiting(t, clk, done) // the second statement waits for a slot (its max_wait timer is set)
	x1.Finish(ctx, nil)   // frees the slot: the waiter takes it at once, the clock unmoved
	if err := <-done; err != nil {
		t.Fatalf("waiter: %v", err)
	}

	// A slot that stays taken: refused when max_wait ends, and not a moment before.
	x1, _ = begin(e, ctx, "select 1")
	go func() {
		_, err := begin(e, ctx, "select 1")
		done <- err
	}()
	waiting(t, clk, done)
	clk.Advance(1999 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("refused before max_wait ended: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(time.Millisecond)
	if d := denial(t, <-done); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("after max_wait: %+v", d)
	}
	// A cancelled context ends the wait with its error.
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		_, err := begin(e, cctx, "select 1")
		done <- err
	}()
	waiting(t, clk, done)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v", err)
	}
	x1.Finish(ctx, nil)
	if n := e.state.Load().budgets[0].b.Waiting(""); n != 0 {
		t.Fatalf("%d statements still queued after every waiter left", n)
	}
}

// waiting returns once a statement sets its wait's timer, and fails the test if the statement
// ends (done) first: it did not wait.
func waiting(t *testing.T, clk *fakeclock.Clock, done <-chan error) {
	t.Helper()
	select {
	case <-clk.Set():
	case err := <-done:
		t.Fatalf("the statement did not wait: %v", err)
	case <-time.After(10 * time.Second): // a watchdog only
		t.Fatal("the statement neither waited nor ended")
	}
}

// TestMaxWaitArrivalOrder: six statements waiting for one slot are admitted in the order they
// arrived, each the moment the one before it ends.
func TestMaxWaitArrivalOrder(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 10s, max_queue: 6}
rules:
  - {budget: q, match: {app: q}}
`)
	ctx := tagging.With(context.Background(), "app", "q")
	hold, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	b := e.state.Load().budgets[0].b
	admitted := make(chan int)
	refused := make(chan error, 6)
	finish := make(chan struct{})
	for i := range 6 {
		go func() {
			x, err := begin(e, ctx, "select 1")
			if err != nil {
				refused <- err
				return
			}
			admitted <- i
			<-finish
			x.Finish(ctx, nil)
		}()
		waiting(t, clk, refused) // it joined the queue and set its timer before the next one arrives
		if n := b.Waiting(""); n != i+1 {
			t.Fatalf("%d waiting after %d arrived", n, i+1)
		}
	}
	hold.Finish(ctx, nil)
	var order []int
	for range 6 {
		order = append(order, <-admitted)
		finish <- struct{}{}
	}
	for i, got := range order {
		if got != i {
			t.Fatalf("admitted in order %v, want arrival order", order)
		}
	}
}

// TestMaxQueueFullRefusesAtOnce: with max_queue waiting, the next statement is refused at
// once, with a RetryAfter, while the queued one still waits; its refusal names the full queue
// (max_queue=1), not only what it would have waited for, which with the queue full of
// statements waiting for the bucket may be a slot while one statement is in flight.
func TestMaxQueueFullRefusesAtOnce(t *testing.T) {
	e, clk := newEngine(t, `
budgets:
  - {name: q, mode: enforce, max_concurrent: 1, max_wait: 5s}
rules:
  - {budget: q, match: {app: q}}
`)
	ctx := tagging.With(context.Background(), "app", "q")
	hold, _ := begin(e, ctx, "select 1")
	done := make(chan error, 1)
	go func() {
		x, err := begin(e, ctx, "select 1")
		if err == nil {
			x.Finish(ctx, nil)
		}
		done <- err
	}()
	waiting(t, clk, done)
	// max_queue defaults to max_concurrent (1): the queue is full.
	_, err := begin(e, ctx, "select 1")
	if d := denial(t, err); d.Reason != vocab.ReasonConcurrency || d.RetryAfter <= 0 || d.Limit != "max_queue=1" {
		t.Fatalf("a statement finding the queue full: %+v", d)
	}
	hold.Finish(ctx, nil)
	if err := <-done; err != nil {
		t.Fatalf("the queued statement: %v", err)
	}
}

func TestReloadKeepsState(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: keep, mode: enforce, max_concurrent: 1}
  - {name: gone, mode: enforce, max_concurrent: 1}
rules:
  - {budget: keep, match: {app: k}}
`)
	ctx := tagging.With(context.Background(), "app", "k")
	x, err := begin(e, ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ := rules.Parse([]byte(`
budgets:
  - {name: keep, mode: enforce, max_concurrent: 1}
rules:
  - {budget: keep, match: {app: k}}
`))
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := begin(e, ctx, "select 1"); err == nil {
		t.Fatal("the in-flight count was lost on reload")
	}
	x.Finish(ctx, nil)
	if err := e.setConfig(&rules.Config{Rules: []rules.Rule{{Budget: "nope", Match: map[string]string{"a": "b"}}}}); err == nil {
		t.Fatal("a rule naming an unknown budget must be refused")
	}
	if len(e.Budgets()) != 1 || e.Budgets()[0].Name != "keep" {
		t.Fatalf("a refused config replaced the rules: %+v", e.Budgets())
	}
}

func TestWarnLogRateLimited(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	e, clk := newEngine(t, `
budgets:
  - {name: w, max_concurrent: 1}
rules:
  - {budget: w, match: {app: w}}
`, func(o *Options) { o.Logger = logger })
	ctx := tagging.With(context.Background(), "app", "w")
	hold, _ := begin(e, ctx, "select 1")
	for range 100 {
		run(e, clk, ctx, "select 1", time.Millisecond)
	}
	clk.Advance(2 * time.Second)
	run(e, clk, ctx, "select 1", time.Millisecond)
	hold.Finish(ctx, nil)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "budget=w"); n != 2 {
		t.Fatalf("%d log lines for 101 warnings in 2s; want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "suppressed=99") {
		t.Fatalf("the second line must say how many were suppressed:\n%s", out)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestCheck(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: jobs, mode: enforce, max_concurrent: 1}
rules:
  - {budget: jobs, match: {job: import}}
`)
	ctx := tagging.With(context.Background(), "job", "import")
	if err := e.Check(ctx); err != nil {
		t.Fatal(err)
	}
	x, _ := begin(e, ctx, "select 1")
	if d := denial(t, e.Check(ctx)); d.Reason != vocab.ReasonConcurrency {
		t.Fatalf("%+v", d)
	}
	if err := e.Check(context.Background()); err != nil {
		t.Fatalf("untagged: %v", err)
	}
	x.Finish(ctx, nil)
	if err := e.Check(ctx); err != nil {
		t.Fatal(err)
	}
}

// rulesN builds a rules file with n rules over n/10+1 budgets; one rule matches app=bench.
func rulesN(n int) string {
	var b strings.Builder
	b.WriteString("budgets:\n  - {name: hot, mode: enforce, max_concurrent: 1000000, server_share: 1, burst_limit: 1000000s}\n")
	for i := range n / 10 {
		fmt.Fprintf(&b, "  - {name: b%d, mode: enforce, max_concurrent: 10}\n", i)
	}
	b.WriteString("rules:\n  - {budget: hot, match: {app: bench}}\n")
	for i := 1; i < n; i++ {
		fmt.Fprintf(&b, "  - {budget: b%d, match: {tenant: t%d}}\n", i%(n/10+1)%max(1, n/10), i)
	}
	return b.String()
}

// The benchmarks below take the driver's path, with the real clock, after a warm-up long enough
// for the pattern's training to be sampled.

// benchEngine returns an engine with the rules and the real clock.
func benchEngine(b *testing.B, rulesText string) *Engine {
	e, _ := newEngine(b, rulesText, func(o *Options) { o.Now, o.After = nil, nil })
	return e
}

// stmt runs one statement through e in x, which the caller reuses as a connection does.
func stmt(b *testing.B, e *Engine, x *Exec, ctx context.Context, q string) {
	if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
		b.Fatal(err)
	}
	x.Finish(ctx, nil)
}

// BenchmarkDecisionPath measures Begin+Finish for a statement matching one hot budget with a
// bucket, whose plan cost is cached: tags merged, rule set matched, cost predicted, admitted,
// released. It should be flat in the number of rules.
func BenchmarkDecisionPath(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			e := benchEngine(b, rulesN(n))
			ctx := tagging.With(context.Background(), "app", "bench", "tenant", "zz")
			q := "select * from orders where id = $1"
			warm(b, e, ctx, q)
			x := new(Exec)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				stmt(b, e, x, ctx, q)
			}
		})
	}
	// The same statement through the same budget, shared: its limits come from a lease (as the
	// coordinator grants them) and the decision stays local (within 10% of the local one is the
	// target). The coordinator's own work runs beside the statements, not in this loop.
	b.Run("rules=10/shared", func(b *testing.B) {
		e := benchEngine(b, rulesN(10))
		hot := e.state.Load().budgets[0].b
		now := e.now()
		hot.SetShared(now, nil, func() {}, time.Second)
		hot.SetLease(now, "", budget.Lease{Rate: 1, Burst: 1_000_000, Slots: 1_000_000})
		ctx := tagging.With(context.Background(), "app", "bench", "tenant", "zz")
		q := "select * from orders where id = $1"
		warm(b, e, ctx, q)
		x := new(Exec)
		b.ReportAllocs()
		b.ResetTimer()
		for b.Loop() {
			stmt(b, e, x, ctx, q)
		}
	})
	// Every statement with other tags (1,000 tenants in turn).
	b.Run("rules=10000/tenant-per-statement", func(b *testing.B) {
		e := benchEngine(b, rulesN(10_000))
		var ctxs []context.Context
		for i := range 1000 {
			ctxs = append(ctxs, tagging.With(context.Background(), "app", "bench", "tenant", fmt.Sprint("u", i)))
		}
		q := "select * from orders where id = $1"
		warm(b, e, ctxs[0], q)
		x := new(Exec)
		b.ReportAllocs()
		b.ResetTimer()
		i := 0
		for b.Loop() {
			stmt(b, e, x, ctxs[i%len(ctxs)], q)
			i++
		}
	})
	b.Run("parallel/one-hot-budget", func(b *testing.B) {
		e := benchEngine(b, rulesN(10))
		ctx := tagging.With(context.Background(), "app", "bench")
		q := "select * from orders where id = $1"
		warm(b, e, ctx, q)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			x := new(Exec) // one per goroutine, as one per connection
			for pb.Next() {
				stmt(b, e, x, ctx, q)
			}
		})
	})
}

// BenchmarkExplainCacheHit isolates the cost path: the same statement through a budget that
// needs no cost (max_concurrent only) and through one that needs it (a bucket) with its plan
// cost cached. The difference is what a plan-cache hit adds to the decision path.
func BenchmarkExplainCacheHit(b *testing.B) {
	for _, tc := range []struct{ name, rules string }{
		{"no-cost", "budgets:\n  - {name: c, mode: enforce, max_concurrent: 1000000}\nrules:\n  - {budget: c, match: {app: bench}}\n"},
		{"cached-plan", "budgets:\n  - {name: c, mode: enforce, max_concurrent: 1000000, server_share: 1, burst_limit: 1000000s}\nrules:\n  - {budget: c, match: {app: bench}}\n"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := benchEngine(b, tc.rules)
			ctx := tagging.With(context.Background(), "app", "bench")
			q := "select * from orders where id = $1"
			warm(b, e, ctx, q)
			x := new(Exec)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				stmt(b, e, x, ctx, q)
			}
		})
	}
}

// BenchmarkNoRules is the fast path: pattern cache hit, no rule, telemetry idle.
func BenchmarkNoRules(b *testing.B) {
	e := benchEngine(b, "")
	ctx := context.Background()
	q := "select * from orders where id = $1"
	x := new(Exec)
	b.ReportAllocs()
	for b.Loop() {
		stmt(b, e, x, ctx, q)
	}
}

// warm caches a plan cost for the statement, as a prior EXPLAIN would have, and runs it until
// its pattern is warm (training sampled).
// waitForLease runs q until a shared budget's first lease admits it.
func warm(b *testing.B, e *Engine, ctx context.Context, q string) {
	x := new(Exec)
	p, _ := e.patterns.Get(q)
	e.model.PutPlan(e.now(), p.FingerprintID, 8.3)
	for range 2 * warmSamples {
		stmt(b, e, x, ctx, q)
	}
}

// recObserver records Decision calls and the merged tags of the last statement started or
// blocked.
type recObserver struct {
	mu        sync.Mutex
	decisions []string
	tags      []ruleset.KV
}

func (r *recObserver) Started(ctx context.Context, x *Exec) context.Context {
	r.saveTags(x)
	return ctx
}
func (r *recObserver) Blocked(_ context.Context, x *Exec, _ error)           { r.saveTags(x) }
func (r *recObserver) Finished(context.Context, *Exec, error, time.Duration) {}
func (r *recObserver) Wants() Wants                                          { return WantSpans | WantDecisions }
func (r *recObserver) saveTags(x *Exec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tags = append(r.tags[:0], x.Tags...)
}
func (r *recObserver) Decision(budget, decision, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.decisions = append(r.decisions, budget+"/"+decision+"/"+reason)
}

func TestDecisionPerBudget(t *testing.T) {
	obs := &recObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: tight, max_concurrent: 1}
  - {name: loose, mode: enforce, max_concurrent: 10}
rules:
  - {budget: tight, match: {app: a}}
  - {budget: loose, match: {app: a}}
guards:
  require_where: warn
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "a")
	x1, _ := begin(e, ctx, "select 1")
	x2, _ := begin(e, ctx, "select 1")
	x1.Finish(ctx, nil)
	x2.Finish(ctx, nil)
	x3, _ := begin(e, context.Background(), "delete from t")
	x3.Finish(ctx, nil)
	want := []string{
		"tight/allow/", "loose/allow/",
		"tight/warn/concurrency", "loose/allow/",
		"require_where/warn/guard",
	}
	if fmt.Sprint(obs.decisions) != fmt.Sprint(want) {
		t.Fatalf("decisions\n got %v\nwant %v", obs.decisions, want)
	}
}

// TestRouting checks that the same text is routed by its context tags and the rules in force:
// each Begin below would be decided wrongly by a route of other tags or rules.
func TestRouting(t *testing.T) {
	const q = "select * from t where id = $1"
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, per: tenant}
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: a, match: {app: x}}
  - {budget: b, match: {app: y}}
`)
	bg := context.Background()
	t1 := tagging.With(bg, "app", "x", "tenant", "t1")
	x1, err := begin(e, t1, q)
	if err != nil {
		t.Fatal(err)
	}
	// Equal tags in other storage; tenant t1's slot is taken.
	for range 2 {
		if _, err := begin(e, tagging.With(bg, "tenant", "t1", "app", "x"), q); denial(t, err).Budget != "a" {
			t.Fatalf("want a denial by a, got %v", err)
		}
	}
	// Another tenant: another key of the same budget.
	x2, err := begin(e, tagging.With(bg, "app", "x", "tenant", "t2"), q)
	if err != nil {
		t.Fatalf("tenant t2 was refused: %v", err)
	}
	// Another app: another budget, then none.
	y := tagging.With(bg, "app", "y")
	x3, err := begin(e, y, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(x3.Budgets) != 1 || x3.Budgets[0] != "b" {
		t.Fatalf("app=y budgets %v, want [b]", x3.Budgets)
	}
	for range 2 {
		x, err := begin(e, tagging.With(bg, "app", "z"), q)
		if err != nil || len(x.Budgets) != 0 {
			t.Fatalf("app=z: budgets %v, err %v; want none", x.Budgets, err)
		}
		x.Finish(bg, nil)
	}
	for range 2 {
		if _, err := begin(e, y, q); denial(t, err).Budget != "b" {
			t.Fatalf("want a denial by b, got %v", err)
		}
	}
	// New rules route app=x to b, which app=y holds, and app=y nowhere: the old routes must
	// not be used.
	cfg, err := rules.Parse([]byte(`
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, per: tenant}
  - {name: b, mode: enforce, max_concurrent: 1}
rules:
  - {budget: b, match: {app: x}}
`))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	x4, err := begin(e, y, q)
	if err != nil || len(x4.Budgets) != 0 {
		t.Fatalf("after the reload app=y: budgets %v, err %v; want none", x4.Budgets, err)
	}
	x4.Finish(bg, nil)
	if _, err := begin(e, tagging.With(bg, "app", "x", "tenant", "t3"), q); denial(t, err).Budget != "b" {
		t.Fatalf("after the reload want a denial by b, got %v", err)
	}
	for _, x := range []*Exec{x1, x2, x3} {
		x.Finish(bg, nil)
	}
	for _, bs := range e.Budgets() {
		if bs.InFlight != 0 {
			t.Fatalf("%s leaked: %+v", bs.Name, bs)
		}
	}
}

// TestPlanCostExpires: a statement uses the cached plan cost until its TTL, then none (no
// connection to EXPLAIN on), then the cache's new one.
func TestPlanCostExpires(t *testing.T) {
	const q = "select * from orders where id = $1"
	e, clk := newEngine(t, `
budgets:
  - {name: b, mode: enforce, per_query_limit: 100s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	p, _ := e.patterns.Get(q)
	planCost := func() float64 {
		t.Helper()
		x, err := begin(e, ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Finish(ctx, nil)
		return x.PlanCost
	}
	e.model.PutPlan(clk.Now(), p.FingerprintID, 8.3)
	if got := planCost(); got != 8.3 {
		t.Fatalf("plan cost %v, want 8.3 from the plan cache", got)
	}
	clk.Advance(cost.PlanTTLOf(p.FingerprintID) - time.Second)
	if got := planCost(); got != 8.3 {
		t.Fatalf("plan cost %v before the TTL, want 8.3", got)
	}
	clk.Advance(time.Second)
	if got := planCost(); got != 0 {
		t.Fatalf("plan cost %v after the TTL, want none (no connection to EXPLAIN on)", got)
	}
	e.model.PutPlan(clk.Now(), p.FingerprintID, 12)
	if got := planCost(); got != 12 {
		t.Fatalf("plan cost %v, want the cache's new 12", got)
	}
	if hits := e.stats.ExplainCacheHits.Load(); hits != 3 {
		t.Fatalf("plan cache hits %d, want 3", hits)
	}
}

// TestRoutingAllocatesNothing: a text whose context tags change with every statement (a tenant
// tag) is routed without allocating.
func TestRoutingAllocatesNothing(t *testing.T) {
	const q = "select * from t where id = $1"
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 100, per: tenant}
rules:
  - {budget: a, match: {app: x}}
`)
	bg := context.Background()
	var ctxs []context.Context
	for i := range 4 {
		ctxs = append(ctxs, tagging.With(bg, "app", "x", "tenant", fmt.Sprint("t", i)))
	}
	i := 0
	x := new(Exec) // reused, as a connection reuses its own
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := e.Begin(ctxs[i%len(ctxs)], x, nil, q, nil); err != nil {
			t.Fatal(err)
		}
		x.Finish(bg, nil)
		i++
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per statement with changing tags, want 0", allocs)
	}
}

// TestExecStart: Start is when Begin decided the statement, however the clock moved since, and
// zero when nothing timed it; with the real clock it has a monotonic reading, so a span's end
// (time.Now) minus it is the statement's duration even if the wall clock stepped.
func TestExecStart(t *testing.T) {
	const rulesText = `
budgets:
  - {name: b, mode: enforce, max_concurrent: 10}
rules:
  - {budget: b, match: {statement: select}}
`
	e, clk := newEngine(t, rulesText)
	clk.Advance(time.Hour)
	begun := clk.Now()
	x, err := begin(e, context.Background(), "select 1")
	if err != nil {
		t.Fatal(err)
	}
	clk.Advance(3 * time.Second)
	if got := x.Start(); !got.Equal(begun) {
		t.Errorf("Start() = %v after 3s, want %v (when Begin ran)", got, begun)
	}
	x.Finish(context.Background(), nil)

	idle, _ := newEngine(t, "")
	x, err = begin(idle, context.Background(), "select 1")
	if err != nil {
		t.Fatal(err)
	}
	if got := x.Start(); !got.IsZero() {
		t.Errorf("no rules, no telemetry: Start() = %v, want the zero Time", got)
	}
	x.Finish(context.Background(), nil)

	real := New(Options{Logger: quiet})
	cfg, err := rules.Parse([]byte(rulesText))
	if err != nil {
		t.Fatal(err)
	}
	if err := real.setConfig(cfg); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	x, err = begin(real, context.Background(), "select 1")
	if err != nil {
		t.Fatal(err)
	}
	after := time.Now()
	start := x.Start()
	if start.Before(before) || start.After(after) {
		t.Errorf("real clock: Start() = %v, not within Begin's call [%v, %v]", start, before, after)
	}
	if s := start.String(); !strings.Contains(s, "m=") {
		t.Errorf("real clock: Start() = %s has no monotonic reading", s)
	}
	x.Finish(context.Background(), nil)
}

// begin begins q in a new Exec, as a connection's first statement would.
func begin(e *Engine, ctx context.Context, q string) (*Exec, error) {
	x := new(Exec)
	if _, err := e.Begin(ctx, x, nil, q, nil); err != nil {
		return nil, err
	}
	return x, nil
}

// TestExecReused: an Exec that decided one statement (a budget, a prediction, a warning)
// decides the next from scratch: nothing of the first leaks into the second, and the first's
// hold was released once.
func TestExecReused(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 10, server_share: 1, burst_limit: 100s, warning_threshold: 0.05}
rules:
  - {budget: a, match: {app: x}}
`)
	x := new(Exec)
	ctx := tagging.With(context.Background(), "app", "x")
	if _, err := e.Begin(ctx, x, nil, "select * from orders where id = $1", nil); err != nil {
		t.Fatal(err)
	}
	if x.Decision != DecisionWarn || !x.Costed || len(x.Budgets) != 1 || len(x.holds) != 1 || x.Tags == nil {
		t.Fatalf("first statement: decision %q, costed %v, budgets %v, holds %d, tags %v", x.Decision, x.Costed, x.Budgets, len(x.holds), x.Tags)
	}
	x.Finish(ctx, nil)
	other := tagging.With(context.Background(), "app", "y")
	if _, err := e.Begin(other, x, nil, "select 2", nil); err != nil {
		t.Fatal(err)
	}
	if x.Decision != DecisionAllow || x.Reason != "" || x.Budgets != nil || x.Costed || x.Predicted != 0 ||
		x.PlanCost != 0 || x.warm || len(x.holds) != 0 || len(x.warned) != 0 || x.Pattern.Normalized != "select $1" {
		t.Fatalf("second statement kept the first's state: %+v", *x)
	}
	x.Finish(other, nil)
	if got := e.Budgets()[0].InFlight; got != 0 {
		t.Fatalf("in flight %d after both finished, want 0", got)
	}
}

func (*recObserver) BatchFinished(context.Context, *Batch, error, time.Duration) {}
