package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strings"
	"time"
)

// Check reports whether a statement carrying ctx's tags would be admitted now by the enforce
// budgets those tags select (health thresholds, zero limits, concurrency and bucket room, and
// whether other statements wait for them first). Not knowing the statement, it asks a bucket
// for room for one like the budget's recent statements, the larger ones (a job's chunks). It
// returns nil or
// a [*BlockedError] and takes nothing; once the Connector (its *sql.DB) or the Pool is closed,
// [ErrClosed]. Batch jobs call it, or Wait, before each chunk.
func (c *core) Check(ctx context.Context) error {
	return blocked(c.engine.Check(ctx))
}

// Wait blocks until Check passes or ctx ends (it then returns ctx's error; a ctx that ended
// before the call, at once, room or not, as pgxpool's Acquire answers). Under a budget with
// max_wait it waits its turn in the budget's queue, as a statement does (in arrival order), and
// returns when it is first with room, taking nothing. A full queue, or a budget without
// max_wait, it checks again after about the refusal's retry hint (at most a health interval),
// with jitter, growing with each attempt, so that many waiting jobs do not all resume at the
// same instant; and at once when the rules are replaced (a reload, SetConfig). Once the Connector (its *sql.DB) or the Pool is closed it returns [ErrClosed],
// at once if it was waiting (as a statement waiting for capacity does), and when called
// afterwards.
func (c *core) Wait(ctx context.Context) error {
	return c.engine.Wait(ctx)
}

// Snapshot is the connector's live state: budgets with what they decided, the hottest
// patterns, recent refusals grouped by pattern, quarantines, rule expiries and counters. It
// contains no SQL literal: query texts are normalised. A query text is at most 4 KiB: a longer
// one (a bulk INSERT's) is cut on a character's boundary and ends with "… (N bytes cut)". Every
// number is finite (a non-finite one, which only a corrupt shared state could produce, reads as
// 0), so a Snapshot always encodes as JSON.
type Snapshot struct {
	Time         time.Time       `json:"time"`
	InFlight     int64           `json:"in_flight"`
	Budgets      []BudgetStatus  `json:"budgets"`
	Patterns     []PatternStatus `json:"patterns"`
	RecentBlocks []BlockStatus   `json:"recent_blocks"`
	// Quarantines are the patterns that a budget refuses for a while (reason quarantine).
	Quarantines []QuarantineStatus `json:"quarantines"`
	// RuleExpiries are the rules in force that lapse by themselves (their until),
	// in rules-file order; one whose until has passed stays listed, lapsed (Until before Time),
	// until the next reload, so that the page shows which emergency rules ended.
	RuleExpiries []RuleExpiryStatus `json:"rule_expiries"`
	Counters     Counters           `json:"counters"`
}

// BudgetStatus is one budget's state in a [Snapshot]. Debt is in execution seconds.
//
// Admitted, Warned and Blocked count the statements the budget decided since the connector
// started (or since the budget appeared), one decision per statement, exactly as the
// pgtraffic.decisions metric counts them for the budget: Admitted ran with nothing to say
// (decision allow), Warned ran with a warning (decision warn: in warn mode, a statement that
// enforce would have refused, or one that left a limit past warning_threshold), Blocked were
// refused (decision block; a statement that waited under max_wait counts once). A statement
// that ran past the budget's max_duration counts a second decision, as the metric does: Blocked
// with reason max_duration when enforce cancelled it, Warned when warn mode let it run. WarnedBy
// and BlockedBy split the last two by reason (the Reason constants, and warning_threshold).
type BudgetStatus struct {
	Name    string  `json:"name"`
	Mode    string  `json:"mode"`
	Debt    float64 `json:"debt_s"`
	MaxDebt float64 `json:"max_debt_s"`
	Burst   float64 `json:"burst_limit_s,omitempty"`
	// InFlight is the budget's slots held: statements running, and the pool's statements
	// admitted that wait for a connection. A statement on a held connection (a transaction's, a
	// PoolConn's) may take the slot of one still waiting for its connection, which is then
	// decided again once it has it: meanwhile the count may read above max_concurrent, while
	// no more than max_concurrent run.
	InFlight  int               `json:"in_flight"`
	Waiting   int               `json:"waiting"` // statements waiting for capacity (max_wait), and jobs in Wait
	Keys      int               `json:"keys"`
	Admitted  uint64            `json:"admitted"`
	Warned    uint64            `json:"warned"`
	Blocked   uint64            `json:"blocked"`
	WarnedBy  map[string]uint64 `json:"warned_by_reason"`
	BlockedBy map[string]uint64 `json:"blocked_by_reason"`
	// History is the budget's last five minutes in ten-second intervals, oldest first, the
	// current (partial) interval last.
	History []SampleStatus `json:"history"`
	// Shared is set for a budget shared across instances through Redis.
	Shared *SharedStatus `json:"shared,omitempty"`
}

// SharedStatus is a shared budget as this instance sees it: its leases (its part of the
// budget, summed over the partitions it takes part in) and, as of its last sync, the global
// debt and the instances sharing the budget.
type SharedStatus struct {
	Instance   string    `json:"instance"`   // this instance's id in Redis
	Partitions int       `json:"partitions"` // partitions with a lease here
	Rate       float64   `json:"lease_rate"` // execution seconds per second
	Burst      float64   `json:"lease_burst_s"`
	Slots      int       `json:"lease_slots"`
	GlobalDebt float64   `json:"global_debt_s"`
	Instances  int       `json:"instances"` // 0 until a sync succeeded
	Fallback   bool      `json:"fallback"`  // the last sync failed: leases kept or decaying
	Syncs      uint64    `json:"syncs"`
	Failures   uint64    `json:"sync_failures"`
	LastSync   time.Time `json:"last_sync"`
	// Ignored counts entries read from Redis that this instance ignored as invalid (shared
	// quarantines that are not a fingerprint with time left).
	Ignored uint64 `json:"ignored_from_redis"`
	// LimitsDiffer says the instances sharing the budget disagree on its limits (a change of
	// the rules half rolled out): every instance then divides the smallest limits any of them
	// holds, LimitsInForce (nil while they agree), until they agree. As last seen.
	LimitsDiffer  bool          `json:"limits_differ"`
	LimitsInForce *SharedLimits `json:"limits_in_force,omitempty"`
}

// SharedLimits are a shared budget's global limits.
type SharedLimits struct {
	Rate          float64 `json:"rate"`    // execution seconds per second; 0: no bucket
	Burst         float64 `json:"burst_s"` // execution seconds
	MaxConcurrent int     `json:"max_concurrent"`
}

// SampleStatus is one interval of a budget's history: its decisions in the interval and the
// largest debt the status (or a metrics scrape) read in it. Nothing samples the budgets in the
// background: an interval in which nothing read the status has no debt (DebtRead false).
type SampleStatus struct {
	Start    time.Time `json:"start"`
	Admitted uint64    `json:"admitted"`
	Warned   uint64    `json:"warned"`
	Blocked  uint64    `json:"blocked"`
	Debt     float64   `json:"debt_s"`
	DebtRead bool      `json:"debt_read"`
}

// PatternStatus is one query pattern's learned cost in a [Snapshot].
type PatternStatus struct {
	Fingerprint string `json:"fingerprint"`
	Query       string `json:"query"` // normalised text: literals replaced by $n, at most 4 KiB
	// Count is the pattern's successful executions since it entered the table, by which the
	// hottest come first: exact for its first executions and for those predicted at a
	// millisecond or more; of the cheap ones after, one in 16, drawn at random, is timed and
	// counts for 16, so the count is an estimate there.
	Count uint64 `json:"count"`
	// MeanCost is the pattern's learned mean cost on the clock named by Clock: the server's
	// mean execution time (ClockServer), or the client's measurement less the network's round
	// trip (ClockClient); for a pattern priced by its plan but never timed (Count 0: a batch's
	// statements, which are not timed apart, or statements refused), the cost its plan predicts.
	MeanCost float64 `json:"mean_cost_s"`
	Clock    string  `json:"clock"`
	// ServerMean is the server's mean execution time of the pattern in its last reports of
	// pg_stat_statements; 0 when it has none.
	ServerMean float64 `json:"server_mean_s"`
	// ClientMean is the client's measurement less the network's round trip, whichever clock
	// Clock names.
	ClientMean float64 `json:"client_mean_s"`
	PlanCost   float64 `json:"mean_plan_cost"`
	K          float64 `json:"k"`
}

// The clocks a pattern's cost can come from ([PatternStatus.Clock]).
const (
	ClockServer = "server" // pg_stat_statements' execution times
	ClockClient = "client" // the client's measurement less the network's round trip
)

// BlockStatus is one group of recent refusals in a [Snapshot]: the statements of one pattern
// that one budget or guard refused for one reason (Decision block), or that a warn-mode budget
// or guard would have refused (Decision warn). A snapshot holds at most 64 groups, the most
// recently refused first; a new group replaces the least recently refused one.
type BlockStatus struct {
	At          time.Time `json:"at"`          // when the last of them was refused
	First       time.Time `json:"first"`       // when the first of them was refused
	Count       uint64    `json:"count"`       // statements refused
	Budget      string    `json:"budget"`      // the budget or guard that refused them
	Decision    string    `json:"decision"`    // "block", or "warn" for a warn-mode would-be refusal
	Reason      string    `json:"reason"`      // one of the Reason constants
	Fingerprint string    `json:"fingerprint"` // their pattern
	Query       string    `json:"query"`       // normalised text: literals replaced by $n, at most 4 KiB
}

// QuarantineStatus is a pattern that a budget refuses until Until (reason quarantine).
type QuarantineStatus struct {
	Budget      string `json:"budget"`
	Fingerprint string `json:"fingerprint"`
	// Query is the normalised text, at most 4 KiB; "" for a pattern another instance
	// quarantined that this one has not met.
	Query string    `json:"query"`
	Until time.Time `json:"until"`
	// Remote is set when another instance sharing the budget quarantined the pattern.
	Remote bool `json:"remote"`
}

// RuleExpiryStatus is a rule in force that stops selecting statements at Until.
type RuleExpiryStatus struct {
	Budget string    `json:"budget"`
	Rule   string    `json:"rule"` // its match, as in BlockedError.Rule
	Until  time.Time `json:"until"`
}

// Counters are event counts since the connector started.
type Counters struct {
	PatternHits        uint64 `json:"pattern_cache_hits"`
	PatternMisses      uint64 `json:"pattern_cache_misses"`
	ExplainCalls       uint64 `json:"explain_calls"`
	ExplainFailures    uint64 `json:"explain_failures"`
	ExplainCacheHits   uint64 `json:"explain_cache_hits"`
	ExplainCacheMisses uint64 `json:"explain_cache_misses"`
	// Reloads counts the rule sets put in force (a rules file read, SetConfig), ReloadFailures
	// the rules files that could not be read or were invalid (the last good rules stay). A
	// SetConfig that is refused returns its error to its caller and is not counted.
	Reloads        uint64 `json:"reloads"`
	ReloadFailures uint64 `json:"reload_failures"`
	Warned         uint64 `json:"warned"`
	Blocked        uint64 `json:"blocked"`
	// Probes counts the statements run as a probe of a pattern refused as costing more than a
	// limit, so that a prediction that is too high corrects itself (see the README).
	Probes uint64 `json:"probes"`
	// The server clock's reads of pg_stat_statements, their failures, and the counters found
	// reset or rejected (see the pgtraffic.server_clock.* metrics).
	ServerClockReads    uint64 `json:"server_clock_reads"`
	ServerClockFailures uint64 `json:"server_clock_failures"`
	ServerClockResets   uint64 `json:"server_clock_resets"`
	ServerClockRejected uint64 `json:"server_clock_rejected"`
	ServerClockShared   uint64 `json:"server_clock_shared_reads"` // adopted from the reader elected for the database
	// NetworkFloor is the round trip taken off the client's measurement of each statement.
	NetworkFloor time.Duration `json:"network_floor_ns"`
}

// Snapshot returns the live state of the [Connector] or [Pool].
func (c *core) Snapshot() Snapshot {
	e := c.engine
	// Empty lists, not nil: JSON consumers get [] rather than null.
	s := Snapshot{Time: time.Now(), InFlight: e.InFlight(), RecentBlocks: []BlockStatus{},
		Budgets: []BudgetStatus{}, Patterns: []PatternStatus{}, Quarantines: []QuarantineStatus{},
		RuleExpiries: []RuleExpiryStatus{}}
	for _, b := range e.RecentBlocks() {
		s.RecentBlocks = append(s.RecentBlocks, BlockStatus{At: b.Last, First: b.First, Count: b.Count,
			Budget: b.Budget, Decision: b.Decision, Reason: b.Reason, Fingerprint: b.Fingerprint, Query: b.Query})
	}
	for _, q := range e.Quarantines() {
		s.Quarantines = append(s.Quarantines, QuarantineStatus{Budget: q.Budget, Fingerprint: q.Fingerprint,
			Query: q.Query, Until: q.Until, Remote: q.Remote})
	}
	for _, r := range e.RuleExpiries() {
		s.RuleExpiries = append(s.RuleExpiries, RuleExpiryStatus{Budget: r.Budget, Rule: r.Rule, Until: r.Until})
	}
	instance := c.rt.Instance()
	for _, b := range c.rt.Budgets() {
		d := &b.Decisions
		bs := BudgetStatus{
			Name: b.Name, Mode: b.Mode, Debt: b.Debt, MaxDebt: b.MaxDebt, Burst: b.Spec.Burst,
			InFlight: b.InFlight, Waiting: b.Waiting, Keys: b.Keys, Admitted: d.Admitted, Warned: d.Warned, Blocked: d.Blocked,
			WarnedBy: d.WarnedBy, BlockedBy: d.BlockedBy, History: make([]SampleStatus, 0, len(d.History)),
		}
		for _, h := range d.History {
			bs.History = append(bs.History, SampleStatus{Start: h.Start, Admitted: h.Admitted, Warned: h.Warned,
				Blocked: h.Blocked, Debt: h.Debt, DebtRead: h.DebtRead})
		}
		if sh := b.Shared; sh != nil {
			bs.Shared = &SharedStatus{Instance: instance, Partitions: sh.Partitions, Rate: sh.Rate, Burst: sh.Burst,
				Slots: sh.Slots, GlobalDebt: sh.GlobalDebt, Instances: sh.Instances, Fallback: sh.Fallback,
				Syncs: sh.Syncs, Failures: sh.Failures, LastSync: sh.LastSync, Ignored: sh.Ignored, LimitsDiffer: sh.LimitsDiffer}
			if in := sh.LimitsInForce; sh.LimitsDiffer {
				bs.Shared.LimitsInForce = &SharedLimits{Rate: in.Rate, Burst: in.Burst, MaxConcurrent: in.MaxConcurrent}
			}
		}
		s.Budgets = append(s.Budgets, bs)
	}
	for _, p := range e.TopPatterns(20) {
		ps := PatternStatus{
			Fingerprint: p.FingerprintHex, Query: p.Text, Count: p.Count, Clock: ClockClient,
			MeanCost: p.MeanActual, ServerMean: p.ServerMean, ClientMean: p.MeanActual, PlanCost: p.MeanPlanCost, K: p.K,
		}
		switch {
		case p.Server:
			ps.Clock, ps.MeanCost = ClockServer, p.ServerMean
		case p.Count == 0:
			ps.MeanCost = p.Predicted // never timed on the client: what its plan predicts
		}
		s.Patterns = append(s.Patterns, ps)
	}
	st := e.Stats()
	hits, misses, _ := e.PatternStats()
	s.Counters = Counters{
		PatternHits: hits, PatternMisses: misses,
		ExplainCalls: st.ExplainCalls.Load(), ExplainFailures: st.ExplainFailures.Load(),
		ExplainCacheHits: st.ExplainCacheHits.Load(), ExplainCacheMisses: st.ExplainCacheMisses.Load(),
		Reloads: st.Reloads.Load(), ReloadFailures: st.ReloadFailures.Load(),
		Warned: st.Warned.Load(), Blocked: st.Blocked.Load(), Probes: st.Probes.Load(), NetworkFloor: e.NetworkFloor(),
	}
	if sc, ok := c.rt.ServerClock(); ok {
		s.Counters.ServerClockReads, s.Counters.ServerClockFailures = sc.Reads, sc.Failures
		s.Counters.ServerClockResets, s.Counters.ServerClockRejected = sc.Resets, sc.Rejected
		s.Counters.ServerClockShared = sc.Shared
	}
	s.finite()
	return s
}

// finite replaces s's non-finite numbers by 0: encoding/json refuses NaN and ±Inf.
func (s *Snapshot) finite() {
	f := func(v *float64) {
		if math.IsNaN(*v) || math.IsInf(*v, 0) {
			*v = 0
		}
	}
	for i := range s.Budgets {
		b := &s.Budgets[i]
		f(&b.Debt)
		f(&b.MaxDebt)
		f(&b.Burst)
		for j := range b.History {
			f(&b.History[j].Debt)
		}
		if sh := b.Shared; sh != nil {
			f(&sh.Rate)
			f(&sh.Burst)
			f(&sh.GlobalDebt)
		}
	}
	for i := range s.Patterns {
		p := &s.Patterns[i]
		f(&p.MeanCost)
		f(&p.ServerMean)
		f(&p.ClientMean)
		f(&p.PlanCost)
		f(&p.K)
	}
}

// Handler serves the [Snapshot]: as JSON when the request asks for it (Accept:
// application/json or ?format=json), else as a small HTML page. Mount it behind your own
// authentication: it shows normalised query texts (never a literal) and budget names. It
// answers GET and HEAD only; every response is marked uncacheable, since it is live state.
func (c *core) Handler() http.Handler { return statusHandler(c.Snapshot) }

// statusHandler serves the snapshots that snapshot returns. A response is rendered whole before
// anything is written, so that a failure answers 500 rather than 200 with a partial body.
func statusHandler(snapshot func() Snapshot) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "pgtraffic: method not allowed", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		s := snapshot()
		var (
			body bytes.Buffer
			err  error
		)
		contentType := "text/html; charset=utf-8"
		if r.URL.Query().Get("format") == "json" || strings.Contains(r.Header.Get("Accept"), "application/json") {
			contentType = "application/json"
			enc := json.NewEncoder(&body)
			enc.SetIndent("", "  ")
			err = enc.Encode(s)
		} else {
			err = statusPage.Execute(&body, s)
		}
		if err != nil {
			http.Error(w, "pgtraffic: the status could not be rendered", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", contentType)
		_, _ = w.Write(body.Bytes())
	})
}

// chart is the points of a budget's history chart, for statusPage's inline SVG: counts per
// interval on one scale, whose top the chart prints (Peak), and debt on its own (up to the
// bucket size), drawn where it was read. A budget without a bucket has no debt line: its debt
// never drains, so it would only climb.
type chart struct {
	W, H                            int
	Label                           string
	Peak                            uint64 // the most decisions of a kind in one interval
	Admitted, Warned, Blocked, Debt string // SVG polyline points
}

func budgetChart(b BudgetStatus) chart {
	c := chart{W: 240, H: 48, Label: "admitted, warned and blocked per interval; debt"}
	n := len(b.History)
	if n < 2 {
		return c
	}
	top, debtTop := uint64(1), b.Burst
	for _, h := range b.History {
		top = max(top, h.Admitted, h.Warned, h.Blocked)
		if b.Burst > 0 {
			debtTop = max(debtTop, h.Debt)
		}
	}
	c.Peak = top
	x := func(i int) float64 { return float64(i)*float64(c.W-2)/float64(n-1) + 1 }
	// A value above zero stands at least a stroke's width above the baseline, so that a few
	// admissions beside thousands of refusals still show.
	y := func(v, top float64) float64 {
		h := v / top * float64(c.H-4)
		if v > 0 {
			h = max(h, 2)
		}
		return float64(c.H-2) - h + 1
	}
	var pts [4]strings.Builder
	for i, h := range b.History {
		for j, v := range [3]uint64{h.Admitted, h.Warned, h.Blocked} {
			fmt.Fprintf(&pts[j], "%.1f,%.1f ", x(i), y(float64(v), float64(top)))
		}
		if h.DebtRead && debtTop > 0 {
			fmt.Fprintf(&pts[3], "%.1f,%.1f ", x(i), y(h.Debt, debtTop))
		}
	}
	c.Admitted, c.Warned, c.Blocked, c.Debt = pts[0].String(), pts[1].String(), pts[2].String(), pts[3].String()
	c.Label = fmt.Sprintf("last %d intervals: at most %d decisions of a kind per interval", n, top)
	if debtTop > 0 {
		c.Label += "; debt up to " + time.Duration(debtTop*float64(time.Second)).Round(time.Millisecond).String()
	}
	return c
}

// statusPage is the HTML view of a Snapshot. html/template escapes every value; the page loads
// nothing from elsewhere, so it works on an isolated admin port.
var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"ms": func(s float64) string {
		return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
	},
	"pct":   func(a, b float64) float64 { return min(100, 100*a/max(b, 1e-12)) },
	"chart": budgetChart,
	"anyShared": func(bs []BudgetStatus) bool {
		for _, b := range bs {
			if b.Shared != nil {
				return true
			}
		}
		return false
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>pgtraffic status</title>
<style>
body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin-bottom:2em}
th,td{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}
th{background:#f4f4f4} td.n{text-align:right;font-variant-numeric:tabular-nums}
td.empty{color:#888;font-style:italic} td.reasons{font-size:12px;color:#555;white-space:nowrap}
svg.chart{background:#fafafa;border:1px solid #ddd;display:block} svg.chart text{font-size:10px;fill:#666}
.admitted{stroke:#2a7d2a} .warned{stroke:#e0a000} .blocked{stroke:#d9534f} .debt{stroke:#3060c0;stroke-dasharray:3 2}
.legend span{font-size:12px;margin-right:1em} .legend b{display:inline-block;width:12px;height:3px;vertical-align:middle;margin-right:3px}
code{font-size:12px} .bar{background:#eee;width:120px;height:10px;display:inline-block}
.bar span{background:#d9534f;height:10px;display:block}
</style></head><body>
<h1>pgtraffic</h1>
<p id="summary">{{len .Budgets}} budgets · {{.InFlight}} statements in flight · {{.Counters.Blocked}} blocked · {{.Counters.Warned}} warned · snapshot {{.Time.Format "15:04:05"}}</p>
<h2>Budgets</h2>
<p class="legend"><span><b style="background:#2a7d2a"></b>admitted</span><span><b style="background:#e0a000"></b>warned</span><span><b style="background:#d9534f"></b>blocked</span><span><b style="background:#3060c0"></b>debt (when read)</span> per 10 s, last 5 min</p>
<table id="budgets"><tr><th>budget</th><th>mode</th><th>debt</th><th>bucket</th><th>in flight</th><th>keys</th><th>admitted</th><th>warned</th><th>blocked</th><th>by reason</th><th>last 5 min</th></tr>
{{range .Budgets}}<tr data-budget="{{.Name}}"><td class="name">{{.Name}}</td><td>{{.Mode}}</td><td class="n">{{if .Burst}}{{ms .Debt}}{{end}}</td>
<td>{{if .Burst}}<span class="bar" title="fullest key: {{ms .MaxDebt}} of {{ms .Burst}}"><span style="width:{{pct .MaxDebt .Burst}}%"></span></span>{{end}}</td>
<td class="n">{{.InFlight}}</td><td class="n">{{.Keys}}</td><td class="n admitted">{{.Admitted}}</td><td class="n warned">{{.Warned}}</td><td class="n blocked">{{.Blocked}}</td>
<td class="reasons">{{range $r, $n := .BlockedBy}}<span class="blocked-by" data-reason="{{$r}}">blocked {{$r}}: {{$n}}</span><br>{{end}}{{range $r, $n := .WarnedBy}}<span class="warned-by" data-reason="{{$r}}">warned {{$r}}: {{$n}}</span><br>{{end}}</td>
<td>{{with chart .}}<svg class="chart" width="{{.W}}" height="{{.H}}" viewBox="0 0 {{.W}} {{.H}}" role="img" aria-label="{{.Label}}"><title>{{.Label}}</title><text class="peak" x="4" y="11">max {{.Peak}}</text>
<polyline class="admitted" fill="none" stroke-width="1.5" points="{{.Admitted}}"/><polyline class="warned" fill="none" stroke-width="1.5" points="{{.Warned}}"/><polyline class="blocked" fill="none" stroke-width="1.5" points="{{.Blocked}}"/>{{if .Debt}}<polyline class="debt" fill="none" stroke-width="1.5" points="{{.Debt}}"/>{{end}}</svg>{{end}}</td></tr>
{{else}}<tr><td class="empty" colspan="11">no budgets in force</td></tr>
{{end}}</table>
{{if anyShared .Budgets}}<h2>Shared budgets</h2>
<table id="shared"><tr><th>budget</th><th>lease rate</th><th>lease bucket</th><th>slots held</th><th>partitions</th><th>global debt</th><th>instances</th><th>Redis</th></tr>
{{range .Budgets}}{{if .Shared}}<tr><td class="name">{{.Name}}</td><td class="n">{{printf "%.3g" .Shared.Rate}}/s</td><td class="n">{{ms .Shared.Burst}}</td><td class="n">{{.Shared.Slots}}</td><td class="n">{{.Shared.Partitions}}</td><td class="n">{{ms .Shared.GlobalDebt}}</td><td class="n">{{.Shared.Instances}}</td><td>{{if .Shared.Fallback}}unreachable: fallback share{{else}}in sync{{end}}{{with .Shared.LimitsInForce}}; instances disagree on its limits: in force {{if .MaxConcurrent}}max_concurrent {{.MaxConcurrent}}{{end}}{{if .Rate}} {{printf "%.3g" .Rate}}/s, burst {{ms .Burst}}{{end}}{{end}}</td></tr>
{{end}}{{end}}</table>{{end}}
<h2>Recent refusals</h2>
<table id="blocks"><tr><th>last</th><th>first</th><th>count</th><th>budget</th><th>decision</th><th>reason</th><th>fingerprint</th><th>query (normalised)</th></tr>
{{range .RecentBlocks}}<tr class="group"><td>{{.At.Format "15:04:05.000"}}</td><td>{{.First.Format "15:04:05.000"}}</td><td class="n count">{{.Count}}</td><td class="budget">{{.Budget}}</td><td class="decision">{{.Decision}}</td><td class="reason">{{.Reason}}</td><td><code>{{.Fingerprint}}</code></td><td><code>{{.Query}}</code></td></tr>
{{else}}<tr><td class="empty" colspan="8">none</td></tr>
{{end}}</table>
<h2>Quarantined patterns</h2>
<table id="quarantines"><tr><th>budget</th><th>fingerprint</th><th>query (normalised)</th><th>until</th><th>by</th></tr>
{{range .Quarantines}}<tr><td>{{.Budget}}</td><td><code>{{.Fingerprint}}</code></td><td><code>{{.Query}}</code></td><td>{{.Until.Format "2006-01-02 15:04:05 MST"}}</td><td>{{if .Remote}}another instance{{else}}this instance{{end}}</td></tr>
{{else}}<tr><td class="empty" colspan="5">none</td></tr>
{{end}}</table>
<h2>Rules that expire</h2>
<table id="rule-expiries"><tr><th>budget</th><th>rule</th><th>until</th></tr>
{{range .RuleExpiries}}<tr><td>{{.Budget}}</td><td><code>{{.Rule}}</code></td><td>{{.Until.Format "2006-01-02 15:04:05 MST"}}</td></tr>
{{else}}<tr><td class="empty" colspan="3">none</td></tr>
{{end}}</table>
<h2>Hottest patterns</h2>
<table id="patterns"><tr><th>fingerprint</th><th>query (normalised)</th><th>count</th><th>mean cost</th><th>clock</th><th>server mean</th><th>client mean</th><th>k</th></tr>
{{range .Patterns}}<tr><td><code>{{.Fingerprint}}</code></td><td><code>{{.Query}}</code></td><td class="n">{{.Count}}</td><td class="n">{{ms .MeanCost}}</td><td class="clock">{{.Clock}}</td><td class="n">{{if .ServerMean}}{{ms .ServerMean}}{{else}}–{{end}}</td><td class="n">{{ms .ClientMean}}</td><td class="n">{{printf "%.3g" .K}}</td></tr>
{{else}}<tr><td class="empty" colspan="8">no costed statements yet</td></tr>
{{end}}</table>
<h2>Counters</h2>
<table id="counters">
<tr><td>pattern cache hits / misses</td><td class="n">{{.Counters.PatternHits}} / {{.Counters.PatternMisses}}</td></tr>
<tr><td>EXPLAIN calls / failures</td><td class="n">{{.Counters.ExplainCalls}} / {{.Counters.ExplainFailures}}</td></tr>
<tr><td>EXPLAIN cache hits / misses</td><td class="n">{{.Counters.ExplainCacheHits}} / {{.Counters.ExplainCacheMisses}}</td></tr>
<tr><td>probes of patterns refused as too costly</td><td class="n">{{.Counters.Probes}}</td></tr>
<tr><td>rule reloads / rejected</td><td class="n">{{.Counters.Reloads}} / {{.Counters.ReloadFailures}}</td></tr>
<tr><td>server clock reads / shared / failures / resets / rejected</td><td class="n">{{.Counters.ServerClockReads}} / {{.Counters.ServerClockShared}} / {{.Counters.ServerClockFailures}} / {{.Counters.ServerClockResets}} / {{.Counters.ServerClockRejected}}</td></tr>
<tr><td>network round trip taken off client measurements</td><td class="n">{{.Counters.NetworkFloor}}</td></tr>
</table>
</body></html>
`))
