package engine

import (
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

// Quarantine is a quarantined pattern, for the status.
type Quarantine struct {
	Budget      string    `json:"budget"`
	Fingerprint string    `json:"fingerprint"`
	Query       string    `json:"query"` // normalised text
	Until       time.Time `json:"until"`
}

// maxQuarantined bounds the patterns a quarantine table tracks (struck or quarantined): past
// it, new patterns are not counted until old ones lapse.
const maxQuarantined = 10000

type quarantineKey struct {
	budget string
	fp     uint64
}

type quarantineEntry struct {
	strikes []time.Time // within the window, oldest first
	until   time.Time   // quarantined until; zero: not quarantined
	p       *pattern.Pattern
}

// quarantines is the engine's table of strikes and quarantines. Its zero value is empty and
// ready; it is safe for concurrent use.
type quarantines struct {
	mu sync.Mutex // protects the fields below
	m  map[quarantineKey]*quarantineEntry
	// specs are the settings each budget's entries were made under: a reload that changes them
	// lifts the budget's quarantines.
	specs map[string]rules.Quarantine
}

// configure records the budgets' quarantine settings at a reload, forgetting the entries of a
// budget whose settings changed or that has none any more.
func (q *quarantines) configure(budgets []rules.Budget) {
	q.mu.Lock()
	defer q.mu.Unlock()
	next := make(map[string]rules.Quarantine)
	for i := range budgets {
		if s := budgets[i].Quarantine; s != nil {
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

// strike counts an overrun of p in bs at now, quarantining p when it is the after-th within
// the window.
func (q *quarantines) strike(now time.Time, bs *budgetState, p *pattern.Pattern) {
	spec := bs.quarantine
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.m == nil {
		q.m = make(map[quarantineKey]*quarantineEntry)
	}
	k := quarantineKey{bs.name, p.FingerprintID}
	en := q.m[k]
	if en == nil {
		if len(q.m) >= maxQuarantined {
			q.prune(now)
			if len(q.m) >= maxQuarantined {
				return
			}
		}
		en = &quarantineEntry{p: p}
		q.m[k] = en
	}
	from := now.Add(-time.Duration(spec.For))
	en.strikes = slices.DeleteFunc(en.strikes, func(t time.Time) bool { return !t.After(from) })
	en.strikes = append(en.strikes, now)
	if len(en.strikes) >= spec.After {
		en.until, en.strikes = now.Add(time.Duration(spec.For)), en.strikes[:0]
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
	return en.until, true
}

// list returns the quarantines in force at now, by budget then fingerprint.
func (q *quarantines) list(now time.Time) []Quarantine {
	q.mu.Lock()
	out := make([]Quarantine, 0, len(q.m))
	for k, en := range q.m {
		if now.Before(en.until) {
			out = append(out, Quarantine{Budget: k.budget, Fingerprint: en.p.Fingerprint, Query: en.p.Normalized, Until: en.until})
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
	return &Denial{Budget: bs.name, Rule: st.ruleName[rule], Reason: ReasonQuarantine, Fingerprint: x.Pattern.Fingerprint,
		Limit: "quarantined until " + until.UTC().Format(time.RFC3339), RetryAfter: until.Sub(now)}
}

// strikes counts x's overruns at its Finish at now, which took took: in its bound's budget
// when it was cancelled, and in each budget with a quarantine whose per_query_limit it
// exceeded.
func (e *Engine) strikes(x *Exec, cancelled bool, took time.Duration, now time.Time) {
	for _, bs := range x.quarantinable {
		if cancelled && bs == x.bound || bs.perQuery > 0 && took > bs.perQuery {
			e.quarantined.strike(now, bs, x.Pattern)
		}
	}
}
