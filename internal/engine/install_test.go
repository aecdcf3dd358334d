package engine

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const guardRules = `
budgets:
  - {name: a, mode: enforce, max_concurrent: 100}
rules:
  - {budget: a, match: {app: x}}
guards:
  require_where: enforce
`

// TestReloadDoesNotHoldStatements: while a reload is provably inside its Compile (held there
// by the engine's clock, which the compile reads), a statement is refused and recorded, and
// the status readers answer: none of them waits for the reload. The reload then completes.
func TestReloadDoesNotHoldStatements(t *testing.T) {
	clk := fakeclock.New()
	var armed atomic.Bool
	inCompile, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	e, _ := newEngine(t, guardRules, func(o *Options) {
		o.Now = func() time.Time {
			if armed.CompareAndSwap(true, false) {
				close(inCompile)
				<-release
			}
			return clk.Now()
		}
	})
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }) })
	cfg, err := rules.Parse([]byte(guardRules + "  block_truncate: enforce\n"))
	if err != nil {
		t.Fatal(err)
	}

	armed.Store(true)
	reloaded := make(chan error, 1)
	go func() { reloaded <- e.setConfig(cfg) }()
	<-inCompile // Compile reads the clock once validated; it waits there, which waits there until release

	done := make(chan error, 1)
	go func() {
		_, err := begin(e, tagging.With(context.Background(), "app", "x"), "delete from orders")
		e.RecentBlocks()
		e.Budgets()
		e.Quarantines()
		done <- err
	}()
	select {
	case err := <-done:
		if d := denial(t, err); d.Reason != vocab.ReasonGuard {
			t.Fatalf("denial %+v, want the require_where guard's", d)
		}
	case <-time.After(10 * time.Second): // a watchdog only: the statement returns at once when right
		t.Fatal("a refused statement or a status reader waited for a reload's compile")
	}
	if rb := e.RecentBlocks(); len(rb) != 1 || rb[0].Budget != vocab.GuardRequireWhere {
		t.Fatalf("recent blocks %+v, want the guard's one", rb)
	}
	releaseOnce.Do(func() { close(release) })
	if err := <-reloaded; err != nil {
		t.Fatal(err)
	}
	if st := e.state.Load(); len(st.guards) != 2 {
		t.Fatalf("%d guards in force after the reload, want 2", len(st.guards))
	}
}

// TestReplacedRulesCollectable: a text cached with its route under one version of the rules
// does not keep that version alive once a reload replaced it, and is routed afresh under the
// new one.
func TestReplacedRulesCollectable(t *testing.T) {
	e, clk := newEngine(t, guardRules)
	ctx := tagging.With(context.Background(), "app", "x")
	const q = "select * from orders where id = 1"
	if err := run(e, clk, ctx, q, time.Millisecond); err != nil {
		t.Fatal(err)
	}
	_, entry := e.texts.get(q, e.patterns)
	if entry.route.Load() == nil {
		t.Fatal("no route saved for the text")
	}
	old := weak.Make(e.state.Load())
	cfg, err := rules.Parse([]byte(`
budgets:
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
	runtime.GC()
	runtime.GC()
	if old.Value() != nil {
		t.Fatal("the replaced rules are still reachable after a reload (a cached route keeps them)")
	}
	x, err := begin(e, ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Budgets) != 1 || x.Budgets[0] != "b" {
		t.Fatalf("budgets %v under the new rules, want [b]", x.Budgets)
	}
	x.Finish(ctx, nil)
}

// TestPatternCacheSizeIsOneSetting: the pattern cache size applies to every cache it names; a
// size of 0 or less is the default in each, not a cache that empties on every new text.
func TestPatternCacheSizeIsOneSetting(t *testing.T) {
	for _, n := range []int{-1, 0, 3} {
		e := New(Options{Logger: quiet, PatternCacheSize: n})
		want := n
		if n <= 0 {
			want = pattern.DefaultMaxEntries
		}
		if e.texts.max != want {
			t.Errorf("size %d: text cache bound %d, want %d", n, e.texts.max, want)
		}
		for _, q := range []string{"select 1", "select 2", "select 1"} {
			e.texts.get(q, e.patterns)
		}
		if h := e.texts.hits.Load(); h != 1 {
			t.Errorf("size %d: %d text cache hits for select 1, 2, 1; want 1", n, h)
		}
	}
}

// BenchmarkRefusedDuringReload runs refused statements while another goroutine reloads a
// 100,000-rule config in a loop. A refused statement records its block without waiting for a
// compile: "max-ms", the slowest refusal, stays far below "reload-ms", the mean time of a
// reload (a statement that waited for one would take about that long).
func BenchmarkRefusedDuringReload(b *testing.B) {
	text := rulesN(100_000) + "guards:\n  require_where: enforce\n"
	cfg, err := rules.Parse([]byte(text))
	if err != nil {
		b.Fatal(err)
	}
	e := benchEngine(b, text)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				if err := e.setConfig(cfg); err != nil {
					b.Error(err)
					return
				}
			}
		}
	})
	ctx := tagging.With(context.Background(), "app", "bench")
	var worst time.Duration
	reloads, began := e.Stats().Reloads.Load(), time.Now()
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		if _, err := begin(e, ctx, "delete from orders"); err == nil {
			b.Fatal("a DELETE without WHERE was admitted")
		}
		worst = max(worst, time.Since(start))
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	reloads = e.Stats().Reloads.Load() - reloads
	b.ReportMetric(float64(worst.Microseconds())/1e3, "max-ms")
	if reloads > 0 {
		b.ReportMetric(float64(time.Since(began).Milliseconds())/float64(reloads), "reload-ms")
	}
}
