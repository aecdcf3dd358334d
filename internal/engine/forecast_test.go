package engine

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// forecastRules is a budget that needs a cost for every statement tagged app=x and takes the
// plan cost from the plan cache (the tests put it there: there is no server to EXPLAIN on).
const forecastRules = `
budgets:
  - {name: b, mode: enforce, per_query_limit: 1000s, explain: pattern}
rules:
  - {budget: b, match: {app: x}}
`

// ownSlots returns texts, copied where needed so that no two share a slot of the engine's
// identity cache, which is direct-mapped on the string's address: two texts in one slot replace
// each other's entry (its cached route and forecast included), so a test of those caches would
// depend on where the linker put its string constants.
func ownSlots(texts []string) []string {
	slotOf := func(q string) uintptr {
		return (uintptr(unsafe.Pointer(unsafe.StringData(q)))>>4 ^ uintptr(len(q))) % fastSlots
	}
	out := make([]string, len(texts))
	used := map[uintptr]bool{}
	for i, q := range texts {
		for used[slotOf(q)] {
			q = strings.Clone(q) // new storage, another address
		}
		used[slotOf(q)] = true
		out[i] = q
	}
	return out
}

// lookup returns the slot's route when it was made under st for tags, else nil: the route
// BeginSpare uses.
func (s *routeSlot) lookup(st *compiled, tags tagging.Tags) *route {
	if r := s.under(st); r != nil && r.tags.Equal(tags) {
		return r
	}
	return nil
}

// modelCount is the number of executions the model has trained pattern fp on.
func modelCount(e *Engine, fp uint64) uint64 {
	for _, s := range e.model.Top(1 << 20) {
		if s.Fingerprint == fp {
			return s.Count
		}
	}
	return 0
}

// TestForecastReuseMatchesModel is differential: over a random history of statements of several
// texts (two of them one pattern), costs, durations and plan costs, each statement's prediction,
// whether reused from its text's cached forecast or not, is bit for bit what the model predicts
// at that moment.
func TestForecastReuseMatchesModel(t *testing.T) {
	e, clk := newEngine(t, forecastRules)
	ctx := tagging.With(context.Background(), "app", "x")
	texts := ownSlots([]string{
		"select * from orders where id = $1",
		"SELECT * FROM orders WHERE id = $1", // the same pattern, another text
		"select count(*) from orders where status = $1",
		"select * from items where order_id = $1 order by id",
	})
	plans := []float64{8.3, 1200, 45_000}
	rng := rand.New(rand.NewPCG(1, 2))
	var spare Spare
	statements := 20_000
	for i := range statements {
		q := texts[rng.IntN(len(texts))]
		p, _ := e.patterns.Get(q)
		fp := p.FingerprintID
		c, ok := e.plans.Get(clk.now(), fp)
		if !ok { // expired (see the clock below): a new plan, as an EXPLAIN would find
			c = plans[rng.IntN(len(plans))]
			e.plans.Put(clk.now(), fp, c)
		}
		if rng.IntN(1000) == 0 {
			e.model.ObserveExplain(0.0001 * float64(1+rng.IntN(5)))
		}
		want, _ := e.model.Predict(fp, c)
		x, err := e.BeginSpare(ctx, &spare, nil, q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if math.Float64bits(x.Predicted) != math.Float64bits(want) || x.PlanCost != c {
			t.Fatalf("statement %d (%q): predicted %v at plan cost %v, the model predicts %v at %v",
				i, q, x.Predicted, x.PlanCost, want, c)
		}
		// Mostly cheap statements, some over trainAlways; a few fail.
		d := time.Duration(50+rng.IntN(400)) * time.Microsecond
		if rng.IntN(20) == 0 {
			d = time.Duration(1+rng.IntN(30)) * time.Millisecond
		}
		clk.advance(d)
		var serr error
		if rng.IntN(50) == 0 {
			serr = errors.New("failed")
		}
		x.Finish(ctx, serr)
		if rng.IntN(100) == 0 {
			clk.advance(e.plans.TTL() / 2) // plans expire now and then
		}
	}
	cached := 0
	for _, q := range texts {
		if _, slot := e.pattern(q); slot != nil && slot.cost.flags.Load()&fcForecast != 0 {
			cached++
		}
	}
	if cached != len(texts) {
		t.Fatalf("%d of %d texts cached a forecast, want all", cached, len(texts))
	}
	var trained uint64
	for _, q := range texts[1:] { // texts[0] and texts[1] are one pattern
		p, _ := e.patterns.Get(q)
		trained += modelCount(e, p.FingerprintID)
	}
	if trained >= uint64(statements)/2 {
		t.Fatalf("the model trained on %d of %d statements: training is not sampled", trained, statements)
	}
}

// TestTrainingSampled: a pattern trains on each of its first warmSamples executions, then on
// about one in trainEvery cheap ones, and always on one that took trainAlways or longer; a failed
// statement never trains, and a statement whose Exec is not a Spare's always does.
func TestTrainingSampled(t *testing.T) {
	const q = "select * from orders where id = $1"
	e, clk := newEngine(t, forecastRules)
	ctx := tagging.With(context.Background(), "app", "x")
	p, _ := e.patterns.Get(q)
	fp := p.FingerprintID
	e.plans.Put(clk.now(), fp, 8.3)
	var spare Spare
	runSpare := func(n int, d time.Duration, err error) {
		t.Helper()
		for range n {
			x, berr := e.BeginSpare(ctx, &spare, nil, q, nil)
			if berr != nil {
				t.Fatal(berr)
			}
			clk.advance(d)
			x.Finish(ctx, err)
		}
	}
	cheap := 100 * time.Microsecond
	runSpare(warmSamples, cheap, nil)
	if got := modelCount(e, fp); got != warmSamples {
		t.Fatalf("after %d cheap statements the model trained %d times, want every one", warmSamples, got)
	}
	const n = 8000
	runSpare(n, cheap, nil)
	got := modelCount(e, fp) - warmSamples
	// Binomial(8000, 1/trainEvery): at 1/16, mean 500, standard deviation about 22.
	if lo, hi := uint64(n/trainEvery*8/10), uint64(n/trainEvery*12/10); got < lo || got > hi {
		t.Fatalf("after %d more cheap statements the model trained %d times, want about %d", n, got, n/trainEvery)
	}
	before := modelCount(e, fp)
	runSpare(100, trainAlways, nil)
	if got := modelCount(e, fp) - before; got != 100 {
		t.Fatalf("100 statements of %v trained %d times, want 100", trainAlways, got)
	}
	before = modelCount(e, fp)
	runSpare(100, trainAlways, errors.New("failed"))
	if got := modelCount(e, fp) - before; got != 0 {
		t.Fatalf("100 failed statements trained %d times, want 0", got)
	}
	before = modelCount(e, fp)
	for range 100 {
		if err := run(e, clk, ctx, q, cheap); err != nil { // Begin: an Exec of the pool
			t.Fatal(err)
		}
	}
	if got := modelCount(e, fp) - before; got != 100 {
		t.Fatalf("100 statements without a Spare trained %d times, want 100", got)
	}
}

// TestSimplePathMatchesGeneral is differential: two engines run the same random program, one
// taking decideSimple for cached simple routes and one taking decide for every statement, and
// every statement's decision, reason, budgets, keys, prediction and error, every decision the
// observer counts, and every budget's state after each statement must agree. The limits are
// tight so that statements are blocked and warned about too.
func TestSimplePathMatchesGeneral(t *testing.T) {
	const rules = `
budgets:
  - {name: small, mode: enforce, max_concurrent: 2, server_share: 0.5, burst_limit: 20ms, warning_threshold: 0.5, explain: pattern, per: tenant}
  - {name: auto, mode: enforce, max_concurrent: 3, per_query_limit: 50ms, explain: auto}
  - {name: plain, mode: enforce, max_concurrent: 1}
  - {name: w, mode: warn, max_concurrent: 1}
rules:
  - {budget: small, match: {app: a}}
  - {budget: auto, match: {app: b}}
  - {budget: plain, match: {app: c}}
  - {budget: w, match: {app: d}}
  - {budget: plain, match: {app: d}}
`
	type side struct {
		e   *Engine
		clk *clock
		obs *recObserver
		sp  Spare
	}
	var sides [2]*side
	for i := range sides {
		obs := &recObserver{}
		e, clk := newEngine(t, rules, func(o *Options) { o.Observer = obs })
		e.noSimple = i == 1
		sides[i] = &side{e: e, clk: clk, obs: obs}
		sides[i].sp.rng = 12345 // both sides sample the same statements for training
		// A fast EXPLAIN round trip: patterns whose times vary widely become volatile, which
		// explain mode auto explains per call (the simple path must leave them to decide).
		e.model.ObserveExplain(1e-5)
	}
	texts := ownSlots([]string{
		"select * from orders where id = $1",
		"select count(*) from orders where status = $1",
		"select * from items where order_id = $1",
	})
	tagSets := [][]string{
		{"app", "a", "tenant", "t1"}, {"app", "a", "tenant", "t2"}, {"app", "b"}, {"app", "c"}, {"app", "d"}, {},
	}
	plans := []float64{8, 300, 5000}
	rng := rand.New(rand.NewPCG(5, 6))
	type open struct {
		x [2]*Exec
		d time.Duration
	}
	var running []open
	simple, blocked, warned := 0, 0, 0
	var q string
	var kv []string
	for step := range 6000 {
		if step%4 == 0 || rng.IntN(4) == 0 { // runs of statements alike, as applications send
			q, kv = texts[rng.IntN(len(texts))], tagSets[rng.IntN(len(tagSets))]
		}
		ctx := context.Background()
		if len(kv) > 0 {
			ctx = tagging.With(ctx, kv...)
		}
		var xs [2]*Exec
		var errs [2]error
		for i, s := range sides {
			p, slot := s.e.pattern(q)
			if _, ok := s.e.plans.Get(s.clk.now(), p.FingerprintID); !ok {
				s.e.plans.Put(s.clk.now(), p.FingerprintID, plans[(step/997+len(q))%len(plans)])
			}
			if i == 0 {
				if rt := slot.lookup(s.e.state.Load(), tagging.From(ctx)); rt != nil && rt.simple {
					simple++
				}
			}
			xs[i], errs[i] = s.e.BeginSpare(ctx, &s.sp, nil, q, nil)
		}
		if (errs[0] == nil) != (errs[1] == nil) || errs[0] != nil && errs[0].Error() != errs[1].Error() {
			t.Fatalf("step %d: errors differ: %v / %v", step, errs[0], errs[1])
		}
		if errs[0] != nil {
			blocked++
		}
		if errs[0] == nil {
			a, b := xs[0], xs[1]
			if a.Decision == DecisionWarn {
				warned++
			}
			if a.Decision != b.Decision || a.Reason != b.Reason || !slices.Equal(a.Budgets, b.Budgets) ||
				math.Float64bits(a.Predicted) != math.Float64bits(b.Predicted) || a.PlanCost != b.PlanCost ||
				len(a.holds) != len(b.holds) {
				t.Fatalf("step %d: %+v / %+v", step, a, b)
			}
			for j := range a.holds {
				if a.holds[j].Key != b.holds[j].Key {
					t.Fatalf("step %d: hold keys %q / %q", step, a.holds[j].Key, b.holds[j].Key)
				}
			}
			d := time.Duration(100+rng.IntN(400)) * time.Microsecond
			if rng.IntN(4) == 0 {
				d *= 20 // widely varying times: volatile patterns
			}
			running = append(running, open{xs, d})
		}
		// Finish some statements, oldest first, with time passing on both clocks alike.
		for len(running) > 0 && (len(running) > 3 || rng.IntN(2) == 0) {
			o := running[0]
			running = running[1:]
			for i, s := range sides {
				s.clk.advance(o.d)
				o.x[i].Finish(context.Background(), nil)
			}
		}
		if !slices.Equal(sides[0].obs.decisions, sides[1].obs.decisions) {
			t.Fatalf("step %d: decisions counted differ:\n%v\n%v", step, sides[0].obs.decisions, sides[1].obs.decisions)
		}
		b0, b1 := sides[0].e.Budgets(), sides[1].e.Budgets()
		if !slices.EqualFunc(b0, b1, func(x, y BudgetState) bool {
			return x.Debt == y.Debt && x.InFlight == y.InFlight && x.Blocked == y.Blocked &&
				x.Admitted == y.Admitted && x.Warned == y.Warned && x.Keys == y.Keys
		}) {
			t.Fatalf("step %d: budgets differ:\n%+v\n%+v", step, b0, b1)
		}
	}
	if simple < 1000 {
		t.Fatalf("only %d statements had a cached simple route: the test does not exercise decideSimple", simple)
	}
	t.Logf("%d statements with a cached simple route, %d blocked, %d warned about", simple, blocked, warned)
	if blocked == 0 || warned == 0 {
		t.Fatalf("%d statements blocked, %d warned about: the limits are too loose to test", blocked, warned)
	}
	volatile := 0
	for _, q := range texts {
		p, _ := sides[0].e.patterns.Get(q)
		if sides[0].e.model.Volatile(p.FingerprintID) {
			volatile++
		}
	}
	if volatile == 0 {
		t.Fatal("no pattern is volatile: the test does not exercise explain mode auto's per-call EXPLAIN")
	}
}

// TestFastEntrySize: a text's entry is 96 bytes, so that it spans two cache lines (see
// fastEntry); a field added must keep it so (or pad it to 128).
func TestFastEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(fastEntry{}); n != 96 && n != 128 {
		t.Fatalf("fastEntry is %d bytes, want 96 or 128", n)
	}
}

// TestEngineLayout: the fields every statement reads share the engine's first cache line, and
// the counters it writes (with the epoch and the plan-cache hit counter) the second.
func TestEngineLayout(t *testing.T) {
	var e Engine
	for _, f := range []struct {
		name     string
		off, end uintptr
		line     uintptr
	}{
		{"logH", unsafe.Offsetof(e.logH), unsafe.Offsetof(e.logH) + unsafe.Sizeof(e.logH), 0},
		{"realClock", unsafe.Offsetof(e.realClock), unsafe.Offsetof(e.realClock) + 1, 0},
		{"fastHits", unsafe.Offsetof(e.fastHits), unsafe.Offsetof(e.fastHits) + 8, 1},
		{"stats.ExplainCacheHits", unsafe.Offsetof(e.stats) + unsafe.Offsetof(e.stats.ExplainCacheHits),
			unsafe.Offsetof(e.stats) + unsafe.Offsetof(e.stats.ExplainCacheHits) + 8, 1},
	} {
		if f.off/64 != f.line || (f.end-1)/64 != f.line {
			t.Errorf("Engine.%s at bytes %d-%d, want it within cache line %d", f.name, f.off, f.end-1, f.line)
		}
	}
}
