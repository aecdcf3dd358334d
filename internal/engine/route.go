package engine

import (
	"hash/maphash"
	"math"
	"sync/atomic"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// route is what the rule set makes of one statement text with one set of context tags: the
// budgets it selects, the rule that selected each, and each one's per-tag value. Nothing else
// feeds it (built-in tags are the engine's; the pattern's facts and the comment tags are the
// text's), so the engine keeps the last route of each text in its identity cache, and a
// statement with the same text and equal context tags under the same rules skips merging tags
// and matching rules, most of the decision's work before admission.
type route struct {
	// The fields a cached route's statement reads come first, so that they share cache lines.
	st   *compiled    // the rules it was made under
	tags tagging.Tags // the context tags it was made for
	// simple: one budget, in enforce mode, without throttle_when, whose cost (if it needs one)
	// may come from the plan cache: a cached simple route takes decideSimple.
	simple   bool
	needCost bool        // a selected budget needs a cost prediction
	explain  explainMode // the most eager explain mode of those budgets
	warn     bool        // a selected budget is in warn mode
	health   bool        // a selected enforce budget has throttle_when
	names    []string    // the selected budgets' names (Exec.Budgets)
	// reqs are the requests of the enforce budgets among them, all but their cost, and
	// reqBudget each one's index in st.budgets: Admit's input, copied for each statement.
	reqs      []budget.Request
	reqBudget []int
	budgets   []int    // indexes into st.budgets of the selected budgets, each once, in rule order
	ruleOf    []int    // the rule that selected each
	keys      []string // each one's per-tag value; "" when it has no per
}

// maxRouteBudgets is the most budgets a cached route holds; a statement that selects more (rare)
// is routed afresh each time.
const maxRouteBudgets = 4

// routeBox is a cached route and its slices' storage, so that caching one is one allocation.
type routeBox struct {
	route
	reqs                       [maxRouteBudgets]budget.Request // read by every statement, first
	names, keys                [maxRouteBudgets]string
	budgets, ruleOf, reqBudget [maxRouteBudgets]int
}

// cached returns a copy of r that owns its storage (r's slices point into an Exec's scratch
// space), or nil when r selects too many budgets to cache.
func (r *route) cached() *route {
	n := len(r.budgets)
	if n > maxRouteBudgets {
		return nil
	}
	b := &routeBox{route: *r}
	copy(b.budgets[:], r.budgets)
	copy(b.ruleOf[:], r.ruleOf)
	copy(b.names[:], r.names)
	copy(b.keys[:], r.keys)
	b.route.budgets, b.route.ruleOf = b.budgets[:n:n], b.ruleOf[:n:n]
	b.route.names, b.route.keys = b.names[:n:n], b.keys[:n:n]
	m := len(r.reqs)
	copy(b.reqs[:], r.reqs)
	copy(b.reqBudget[:], r.reqBudget)
	b.route.reqs, b.route.reqBudget = b.reqs[:m:m], b.reqBudget[:m:m]
	b.route.simple = n == 1 && m == 1 && !r.warn && !r.health && (!r.needCost || r.explain != explainCall)
	return &b.route
}

// routeSlot holds what the engine keeps per statement text: its last route, and its cost
// state (a copy of its pattern's plan cost from the plan cache, and its last cost forecast).
type routeSlot struct {
	p    atomic.Pointer[route]
	cost costCache
	// seen is a hash of the context tags of the text's last route made afresh. A route is
	// cached only when the same tags miss twice in a row: a text whose tags change with every
	// statement (a tenant or request tag) then routes afresh each time, as it would anyway, but
	// does not also allocate a route that nothing reuses.
	seen atomic.Uint64
}

// costCache is a text's cost state, read by every statement under a budget that needs a cost:
//
//   - A copy of its pattern's plan cost from the plan cache, which saves the cache's lock and
//     lookup. It expires with the entry it copies, so it is never staler.
//   - Its last stable forecast from the cost model (see cost.Forecast): while the model's
//     generation of the pattern and the plan cost are unchanged, the forecast is what the model
//     would answer, and reading it here takes a few atomic loads instead of the model's lock and
//     table lookup. A pattern that trains (see Exec.train) changes its generation, so the next
//     statement asks the model again.
//
// Both live in the text's entry, so that the statement reads one block rather than objects
// elsewhere. The fields are written under a sequence lock: seq is odd while a writer is at
// work, and a reader that sees it odd or changed takes the miss. A writer that finds another at
// work skips its update rather than wait. Every field is atomic, so readers and writers do not
// race.
type costCache struct {
	seq     atomic.Uint64
	plan    atomic.Uint64 // the plan cost copy, as float64 bits
	expires atomic.Int64  // when the copy expires, in ns since the engine's epoch; 0: no copy
	// The forecast: the plan cost it was made for, the cost.Gen it was made from, the
	// prediction (float64 bits; 0 when the model could not predict, as the callers want it)
	// and fcVolatile, fcForecast (a forecast is held).
	fplan   atomic.Uint64
	gen     atomic.Uint64
	seconds atomic.Uint64
	flags   atomic.Uint32
}

const (
	fcVolatile uint32 = 1 << iota
	fcForecast
)

// planCost returns the text's copy of its plan cost if it has not expired at now (ns since the
// engine's epoch). A nil slot has none.
func (s *routeSlot) planCost(now int64) (float64, bool) {
	if s == nil {
		return 0, false
	}
	f := &s.cost
	seq := f.seq.Load()
	plan, exp := f.plan.Load(), f.expires.Load()
	if seq&1 != 0 || f.seq.Load() != seq || exp == 0 || now >= exp {
		return 0, false
	}
	return math.Float64frombits(plan), true
}

// costFor returns, in one read, the text's plan cost copy valid at now (planned false: none)
// and the forecast for it, when one is held that was made at m's current generation of pattern
// fp (hit false: none): decideSimple's whole cost lookup.
func (s *routeSlot) costFor(now int64, m *cost.Model, fp uint64) (c, seconds float64, volatile, planned, hit bool) {
	f := &s.cost
	seq := f.seq.Load()
	plan, exp, fplan := f.plan.Load(), f.expires.Load(), f.fplan.Load()
	gen, secs, flags := f.gen.Load(), f.seconds.Load(), f.flags.Load()
	if seq&1 != 0 || f.seq.Load() != seq || exp == 0 || now >= exp {
		return 0, 0, false, false, false
	}
	c = math.Float64frombits(plan)
	if flags&fcForecast == 0 || fplan != plan || gen != uint64(m.Gen(fp)) {
		return c, 0, false, true, false
	}
	return c, math.Float64frombits(secs), flags&fcVolatile != 0, true, true
}

// setPlan keeps a copy of a plan cost valid until expires (ns since the engine's epoch); a nil
// slot keeps nothing.
func (s *routeSlot) setPlan(c float64, expires int64) {
	if s == nil {
		return
	}
	f := &s.cost
	seq := f.seq.Load()
	if seq&1 != 0 || !f.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	f.plan.Store(math.Float64bits(c))
	f.expires.Store(max(expires, 1)) // 0 means no copy
	f.seq.Store(seq + 2)
}

// forecast returns the text's forecast for plan cost c if it was made at generation g.
func (s *routeSlot) forecast(c float64, g cost.Gen) (seconds float64, volatile, hit bool) {
	f := &s.cost
	seq := f.seq.Load()
	fplan, gen := f.fplan.Load(), f.gen.Load()
	secs, flags := f.seconds.Load(), f.flags.Load()
	if seq&1 != 0 || f.seq.Load() != seq || flags&fcForecast == 0 || fplan != math.Float64bits(c) ||
		gen != uint64(g) {
		return 0, false, false
	}
	return math.Float64frombits(secs), flags&fcVolatile != 0, true
}

// setForecast keeps fc, the model's stable forecast for plan cost c, unless another writer is
// at work.
func (s *routeSlot) setForecast(c float64, fc cost.Forecast) {
	f := &s.cost
	seq := f.seq.Load()
	if seq&1 != 0 || !f.seq.CompareAndSwap(seq, seq+1) {
		return
	}
	flags := fcForecast
	if fc.Volatile {
		flags |= fcVolatile
	}
	f.fplan.Store(math.Float64bits(c))
	f.gen.Store(uint64(fc.Gen))
	f.seconds.Store(math.Float64bits(fc.Seconds))
	f.flags.Store(flags)
	f.seq.Store(seq + 2)
}

// under returns the slot's route when it was made under st (for any tags), else nil; a nil slot
// (a text the identity cache does not keep) has none. Routes are made only under rule sets with
// rules. The route is the statement's if it was made for equal context tags (see BeginSpare).
func (s *routeSlot) under(st *compiled) *route {
	if s == nil {
		return nil
	}
	if r := s.p.Load(); r != nil && r.st == st {
		return r
	}
	return nil
}

// offer caches r (made in scratch space) in the slot if the previous route made afresh for the
// text was for the same tags (see seen); a nil slot keeps nothing.
func (s *routeSlot) offer(r *route) {
	if s == nil {
		return
	}
	if h := tagsHash(r.tags); s.seen.Swap(h) != h {
		return
	}
	if c := r.cached(); c != nil {
		s.p.Store(c)
	}
}

var tagsSeed = maphash.MakeSeed()

// tagsHash hashes t's pairs; it is never 0, the slot's "none seen".
func tagsHash(t tagging.Tags) uint64 {
	var h maphash.Hash
	h.SetSeed(tagsSeed)
	for k, v := range t.All() {
		h.WriteString(k)
		h.WriteByte(0)
		h.WriteString(v)
		h.WriteByte(0)
	}
	return h.Sum64() | 1
}
