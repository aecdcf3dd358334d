package engine

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// A budget with quarantine: {after: N, for: D} refuses for D the patterns whose statements
// overran it N times within D: cancelled past its max_duration, or measured above its
// per_query_limit. Strikes are counted at Finish; the refusal is checked at admission, only for
// the budgets that have a quarantine.
//
// A shared budget shares its quarantines (strikes stay per instance): a quarantine this
// instance begins is handed to the budget's coordinator handle, which publishes it at its
// next sync, and each sync hands back the budget's quarantines in force on every instance
// (AddQuarantines), which this table takes as its own until they end; the instances refuse
// the pattern within two sync intervals of one another (see package coord). A quarantine
// learnt so is lifted like one made here: when it ends, or by a reload that changes the
// budget's quarantine settings (the instance then shares under the new settings only). Redis
// down, each instance goes on quarantining on its own.

// Quarantine is a quarantined pattern, for the status.
type Quarantine struct {
	Budget      string `json:"budget"`
	Fingerprint string `json:"fingerprint"`
	// Query is the normalised text, cut to bounded.QueryLen; "" for a pattern that another
	// instance quarantined and this one has not met since it started.
	Query string    `json:"query"`
	Until time.Time `json:"until"`
	// Remote says that another instance sharing the budget quarantined the pattern (the
	// quarantine in force was learnt through Redis).
	Remote bool `json:"remote"`
}

// maxQuarantined bounds the patterns a quarantine table tracks (struck or quarantined): past
// it, a new pattern takes the place of one of the budget that holds the most (evict).
const maxQuarantined = 10000

type quarantineKey struct {
	budget string
	fp     uint64
}

type quarantineEntry struct {
	strikes []time.Time      // within the window, oldest first
	until   time.Time        // quarantined until; zero: not quarantined
	remote  bool             // until was learnt from another instance
	p       *pattern.Pattern // nil for a pattern learnt from another instance, until met here
}

// quarantines is the engine's table of strikes and quarantines. Its zero value is empty and
// ready; it is safe for concurrent use.
type quarantines struct {
	mu sync.Mutex // protects the fields below
	m  map[quarantineKey]*quarantineEntry
	// specs are the settings each budget's entries were made under: a reload that changes them
	// lifts the budget's quarantines.
	specs map[string]rules.Quarantine
	// publish hands a new quarantine of a shared budget to its coordinator (coord.Handle's
	// Quarantine), by budget; called outside mu.
	publish map[string]func(fp uint64, until time.Time)
}

// share sets (publish non-nil) or clears how the quarantines of budget are published.
func (q *quarantines) share(budget string, publish func(fp uint64, until time.Time)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if publish == nil {
		delete(q.publish, budget)
		return
	}
	if q.publish == nil {
		q.publish = make(map[string]func(uint64, time.Time))
	}
	q.publish[budget] = publish
}

// configure records the budgets' quarantine settings at a reload, forgetting the entries of a
// budget whose settings changed or that has none any more.
func (q *quarantines) configure(budgets []rules.Budget) {
	q.mu.Lock()
	defer q.mu.Unlock()
	next := make(map[string]rules.Quarantine)
	for i := range budgets {
		// An off budget refuses nothing: its quarantines are lifted as if it had none, and
		// one turned on again starts with none.
		if s := budgets[i].Quarantine; s != nil && parseMode(budgets[i].Mode) != modeOff {
			next[budgets[i].Name] = *s
		}
	}
	for k := range q.m {
		if old, ok := q.specs[k.budget]; !ok || next[k.budget] != old {
			delete(q.m, k)
		}
	}
	q.specs = next
}

// strike counts an overrun at now of a statement of p in bs that began at began, quarantining
// p when it is the after-th within the window; a new quarantine of a shared budget is
// published.
//
// Statements of p that ran together overran as one event: a stall of the server (a paused
// VM, a storage hang) cuts every statement in flight at once, and a quick pattern that
// happened to be busy must not be quarantined for the window after the server recovers. So
// the overrun of a statement that began before p's last strike counts no new strike.
func (q *quarantines) strike(now, began time.Time, bs *budgetState, p *pattern.Pattern) {
	if publish, until := q.count(now, began, bs, p); publish != nil {
		publish(p.FingerprintID, until)
	}
}

// count is strike's work under the lock: it returns how to publish the quarantine it began,
// if it began one of a shared budget.
func (q *quarantines) count(now, began time.Time, bs *budgetState, p *pattern.Pattern) (func(uint64, time.Time), time.Time) {
	q.mu.Lock()
	defer q.mu.Unlock()
	spec, ok := q.specs[bs.name]
	if !ok || spec != *bs.quarantine {
		// Admitted under rules a reload has replaced since, whose quarantine settings for the
		// budget differ or are gone: its overrun counts under neither.
		return nil, time.Time{}
	}
	en := q.entry(now, quarantineKey{bs.name, p.FingerprintID})
	en.p = p
	from := now.Add(-time.Duration(spec.For))
	en.strikes = slices.DeleteFunc(en.strikes, func(t time.Time) bool { return !t.After(from) })
	if n := len(en.strikes); n > 0 && began.Before(en.strikes[n-1]) {
		return nil, time.Time{} // it ran beside the overrun that struck last: the same event
	}
	en.strikes = append(en.strikes, now)
	if len(en.strikes) < spec.After {
		return nil, time.Time{}
	}
	en.until, en.remote, en.strikes = now.Add(time.Duration(spec.For)), false, en.strikes[:0]
	return q.publish[bs.name], en.until
}

// entry returns k's entry, made if need be, making room in a full table. q.mu must be held.
func (q *quarantines) entry(now time.Time, k quarantineKey) *quarantineEntry {
	if q.m == nil {
		q.m = make(map[quarantineKey]*quarantineEntry)
	}
	en := q.m[k]
	if en == nil {
		if len(q.m) >= maxQuarantined {
			q.prune(now)
			if len(q.m) >= maxQuarantined {
				q.evict()
			}
		}
		en = &quarantineEntry{}
		q.m[k] = en
	}
	return en
}

// evict forgets one entry of the full table, of the budget that holds the most, so that one
// budget's churn of patterns (an ORM's, under a tight per_query_limit) never stops another
// from quarantining: of that budget's entries, one with strikes only, else the quarantine
// that ends first. q.mu must be held.
func (q *quarantines) evict() {
	held := make(map[string]int)
	most := ""
	for k := range q.m {
		if held[k.budget]++; held[k.budget] > held[most] {
			most = k.budget
		}
	}
	var victim quarantineKey
	var first time.Time // victim's end of quarantine; zero: strikes only
	found := false
	for k, en := range q.m {
		if k.budget == most && (!found || en.until.Before(first)) {
			victim, first, found = k, en.until, true
		}
	}
	delete(q.m, victim)
}

// Quarantined is a pattern quarantined in a shared budget until Until, as another instance
// published it.
type Quarantined struct {
	Fingerprint uint64 // pg_query's fingerprint (pattern.Pattern.FingerprintID)
	Until       time.Time
}

// ShareQuarantines sets (publish non-nil) or clears how the new quarantines of budget are
// published to the other instances sharing it. publish is called outside every lock of the
// engine.
func (e *Engine) ShareQuarantines(budget string, publish func(fp uint64, until time.Time)) {
	e.quarantined.share(budget, publish)
}

// AddQuarantines takes the quarantines in force across the instances sharing budget, read at
// now under the quarantine settings settings. Each extends the pattern's quarantine here to its
// end; those read under settings that are no longer the budget's (a reload since they were
// read) are dropped. It is safe for concurrent use.
func (e *Engine) AddQuarantines(now time.Time, budget string, settings rules.Quarantine, qs []Quarantined) {
	q := &e.quarantined
	q.mu.Lock()
	defer q.mu.Unlock()
	if cur, ok := q.specs[budget]; !ok || cur != settings {
		return
	}
	for _, r := range qs {
		if !now.Before(r.Until) {
			continue
		}
		if en := q.entry(now, quarantineKey{budget, r.Fingerprint}); r.Until.After(en.until) {
			// This instance's own quarantine comes back a little later than it began here (the
			// sync's round trip): it stays this instance's.
			en.remote = en.remote || !now.Before(en.until)
			en.until = r.Until
		}
	}
}

// prune forgets the entries with neither a quarantine nor a strike in force at now.
func (q *quarantines) prune(now time.Time) {
	for k, en := range q.m {
		if !now.Before(en.until) && (len(en.strikes) == 0 || !now.Before(en.strikes[len(en.strikes)-1].Add(time.Duration(q.specs[k.budget].For)))) {
			delete(q.m, k)
		}
	}
}

// until returns when p's quarantine in budget ends, if it is quarantined at now.
func (q *quarantines) until(now time.Time, budget string, p *pattern.Pattern) (time.Time, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	en := q.m[quarantineKey{budget, p.FingerprintID}]
	if en == nil || !now.Before(en.until) {
		return time.Time{}, false
	}
	en.p = p // a pattern learnt from another instance gets its text for the status
	return en.until, true
}

// list returns the quarantines in force at now, by budget then fingerprint.
func (q *quarantines) list(now time.Time) []Quarantine {
	q.mu.Lock()
	out := make([]Quarantine, 0, len(q.m))
	for k, en := range q.m {
		if now.Before(en.until) {
			qq := Quarantine{Budget: k.budget, Until: en.until, Remote: en.remote}
			if en.p != nil {
				qq.Fingerprint, qq.Query = en.p.Fingerprint, en.p.Normalized
			} else {
				qq.Fingerprint = vocab.FingerprintHex(k.fp)
			}
			out = append(out, qq)
		}
	}
	q.mu.Unlock()
	slices.SortFunc(out, func(a, b Quarantine) int {
		if c := strings.Compare(a.Budget, b.Budget); c != 0 {
			return c
		}
		return strings.Compare(a.Fingerprint, b.Fingerprint)
	})
	return out
}

// Quarantines returns the patterns quarantined now, with their budget and expiry.
func (e *Engine) Quarantines() []Quarantine { return e.quarantined.list(e.now()) }

// quarantineDenial returns bs's refusal of x, selected by rule, at now when x's pattern is
// quarantined in bs; else nil. RetryAfter is the time left.
func (e *Engine) quarantineDenial(st *compiled, bs *budgetState, rule int, x *Exec, now time.Time) *Denial {
	if bs.quarantine == nil {
		return nil
	}
	until, ok := e.quarantined.until(now, bs.name, x.Pattern)
	if !ok {
		return nil
	}
	return &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: vocab.ReasonQuarantine, Fingerprint: x.Pattern.Fingerprint,
		Limit: "quarantined until " + until.UTC().Format(time.RFC3339), RetryAfter: until.Sub(now)}
}

// noteQuarantinable records, for admitted x, its budgets of rt that have a quarantine: the
// budgets whose strikes its Finish counts.
func (x *Exec) noteQuarantinable(st *compiled, rt *route) {
	for _, bi := range rt.budgets {
		if bs := st.budgets[bi]; bs.quarantine != nil {
			x.quarantinable = append(x.quarantinable, bs)
		}
	}
}

// strikes counts x's overruns at its Finish at now, which took took and cost cost seconds (the
// measured cost its budgets were charged: on the server's clock, or the client's less the
// network's round trip): when it was cancelled, in its bound's budget and in every other
// enforce budget whose max_duration cut it off as well (the same bound: the block is counted
// once, by the first, as a refusal names one budget, but each budget's quarantine counts the
// overruns past its own max_duration, whatever the order of the rules), in a warn budget whose
// max_duration it ran past (a dry run counts what enforce would have cut off), and in each
// budget with a quarantine whose per_query_limit its cost exceeded.
func (e *Engine) strikes(x *Exec, cancelled bool, took time.Duration, cost float64, now time.Time) {
	for _, bs := range x.quarantinable {
		if cancelled && (bs == x.bound || bs.mode == modeEnforce && bs.maxDuration > 0 && bs.maxDuration <= x.MaxDuration) ||
			bs.mode == modeWarn && bs.maxDuration > 0 && took > bs.maxDuration ||
			bs.perQuery > 0 && cost > bs.perQuery.Seconds() {
			e.quarantined.strike(now, now.Add(-took), bs, x.Pattern)
		}
	}
}
