package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"html/template"
	"math"
	"net/http"
	"strings"
	"time"
)

// Check reports whether a statement carrying ctx's tags would be admitted now by the enforce
// budgets those tags select (health thresholds, concurrency and bucket room). It returns nil or
// a [*BlockedError] and takes nothing. Batch jobs call it, or Wait, before each chunk.
func (c *core) Check(ctx context.Context) error {
	return blocked(c.engine.Check(ctx))
}

// Wait blocks until Check passes or ctx ends, backing off with jitter between
// checks so that many waiting jobs do not all resume at the same instant.
func (c *core) Wait(ctx context.Context) error {
	return c.engine.Wait(ctx)
}

// Snapshot is the connector's live state: budgets, the hottest patterns, recent blocks and
// counters. It contains no SQL literal: query texts are normalised. Every number is finite (a
// non-finite one, which only a corrupt shared state could produce, reads as 0), so a Snapshot
// always encodes as JSON.
type Snapshot struct {
	Time         time.Time       `json:"time"`
	InFlight     int64           `json:"in_flight"`
	Budgets      []BudgetStatus  `json:"budgets"`
	Patterns     []PatternStatus `json:"patterns"`
	RecentBlocks []BlockStatus   `json:"recent_blocks"`
	Counters     Counters        `json:"counters"`
}

// BudgetStatus is one budget's state in a [Snapshot]. Debt is in execution seconds.
type BudgetStatus struct {
	Name     string  `json:"name"`
	Mode     string  `json:"mode"`
	Debt     float64 `json:"debt_s"`
	MaxDebt  float64 `json:"max_debt_s"`
	Burst    float64 `json:"burst_limit_s,omitempty"`
	InFlight int     `json:"in_flight"`
	Keys     int     `json:"keys"`
	Admitted uint64  `json:"admitted"`
	Warned   uint64  `json:"warned"`
	Blocked  uint64  `json:"blocked"`
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
}

// PatternStatus is one query pattern's learned cost in a [Snapshot].
type PatternStatus struct {
	Fingerprint string  `json:"fingerprint"`
	Query       string  `json:"query"` // normalised text: literals replaced by $n
	Count       uint64  `json:"count"`
	MeanCost    float64 `json:"mean_cost_s"`
	PlanCost    float64 `json:"mean_plan_cost"`
	K           float64 `json:"k"`
}

// BlockStatus is one recent block in a [Snapshot].
type BlockStatus struct {
	At          time.Time `json:"at"`          // when the statement was refused
	Budget      string    `json:"budget"`      // the budget or guard that refused it
	Reason      string    `json:"reason"`      // one of the Reason constants
	Fingerprint string    `json:"fingerprint"` // the statement's pattern
	Query       string    `json:"query"`       // normalised text: literals replaced by $n
}

// Counters are event counts since the connector started.
type Counters struct {
	PatternHits        uint64 `json:"pattern_cache_hits"`
	PatternMisses      uint64 `json:"pattern_cache_misses"`
	ExplainCalls       uint64 `json:"explain_calls"`
	ExplainFailures    uint64 `json:"explain_failures"`
	ExplainCacheHits   uint64 `json:"explain_cache_hits"`
	ExplainCacheMisses uint64 `json:"explain_cache_misses"`
	Reloads            uint64 `json:"reloads"`
	ReloadFailures     uint64 `json:"reload_failures"`
	Warned             uint64 `json:"warned"`
	Blocked            uint64 `json:"blocked"`
}

// Snapshot returns the live state of the [Connector] or [Pool].
func (c *core) Snapshot() Snapshot {
	e := c.engine
	// Empty lists, not nil: JSON consumers get [] rather than null.
	s := Snapshot{Time: time.Now(), InFlight: e.InFlight(), RecentBlocks: []BlockStatus{},
		Budgets: []BudgetStatus{}, Patterns: []PatternStatus{}}
	for _, b := range e.RecentBlocks() {
		s.RecentBlocks = append(s.RecentBlocks, BlockStatus{At: b.At, Budget: b.Budget, Reason: b.Reason,
			Fingerprint: b.Fingerprint, Query: b.Query})
	}
	instance := e.Instance()
	for _, b := range e.Budgets() {
		bs := BudgetStatus{
			Name: b.Name, Mode: b.Mode, Debt: b.Debt, MaxDebt: b.MaxDebt, Burst: b.Spec.Burst,
			InFlight: b.InFlight, Keys: b.Keys, Admitted: b.Admitted, Warned: b.Warned, Blocked: b.Blocked,
		}
		if sh := b.Shared; sh != nil {
			bs.Shared = &SharedStatus{Instance: instance, Partitions: sh.Partitions, Rate: sh.Rate, Burst: sh.Burst,
				Slots: sh.Slots, GlobalDebt: sh.GlobalDebt, Instances: sh.Instances, Fallback: sh.Fallback,
				Syncs: sh.Syncs, Failures: sh.Failures, LastSync: sh.LastSync}
		}
		s.Budgets = append(s.Budgets, bs)
	}
	for _, p := range e.TopPatterns(20) {
		s.Patterns = append(s.Patterns, PatternStatus{
			Fingerprint: p.FingerprintHex, Query: p.Query, Count: p.Count,
			MeanCost: p.MeanActual, PlanCost: p.MeanPlanCost, K: p.K,
		})
	}
	st := e.Stats()
	hits, misses, _ := e.PatternStats()
	s.Counters = Counters{
		PatternHits: hits, PatternMisses: misses,
		ExplainCalls: st.ExplainCalls.Load(), ExplainFailures: st.ExplainFailures.Load(),
		ExplainCacheHits: st.ExplainCacheHits.Load(), ExplainCacheMisses: st.ExplainCacheMisses.Load(),
		Reloads: st.Reloads.Load(), ReloadFailures: st.ReloadFailures.Load(),
		Warned: st.Warned.Load(), Blocked: st.Blocked.Load(),
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
		if sh := b.Shared; sh != nil {
			f(&sh.Rate)
			f(&sh.Burst)
			f(&sh.GlobalDebt)
		}
	}
	for i := range s.Patterns {
		p := &s.Patterns[i]
		f(&p.MeanCost)
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

// statusPage is the HTML view of a Snapshot. html/template escapes every value; the page loads
// nothing from elsewhere, so it works on an isolated admin port.
var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"ms": func(s float64) string {
		return time.Duration(s * float64(time.Second)).Round(time.Microsecond).String()
	},
	"pct": func(a, b float64) float64 { return min(100, 100*a/max(b, 1e-12)) },
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
td.empty{color:#888;font-style:italic}
code{font-size:12px} .bar{background:#eee;width:120px;height:10px;display:inline-block}
.bar span{background:#d9534f;height:10px;display:block}
</style></head><body>
<h1>pgtraffic</h1>
<p id="summary">{{len .Budgets}} budgets · {{.InFlight}} statements in flight · {{.Counters.Blocked}} blocked · {{.Counters.Warned}} warned · snapshot {{.Time.Format "15:04:05"}}</p>
<h2>Budgets</h2>
<table id="budgets"><tr><th>budget</th><th>mode</th><th>debt</th><th>bucket</th><th>in flight</th><th>keys</th><th>admitted</th><th>warned</th><th>blocked</th></tr>
{{range .Budgets}}<tr><td class="name">{{.Name}}</td><td>{{.Mode}}</td><td class="n">{{ms .Debt}}</td>
<td>{{if .Burst}}<span class="bar" title="fullest key: {{ms .MaxDebt}} of {{ms .Burst}}"><span style="width:{{pct .MaxDebt .Burst}}%"></span></span>{{end}}</td>
<td class="n">{{.InFlight}}</td><td class="n">{{.Keys}}</td><td class="n">{{.Admitted}}</td><td class="n">{{.Warned}}</td><td class="n blocked">{{.Blocked}}</td></tr>
{{else}}<tr><td class="empty" colspan="9">no budgets in force</td></tr>
{{end}}</table>
{{if anyShared .Budgets}}<h2>Shared budgets</h2>
<table id="shared"><tr><th>budget</th><th>lease rate</th><th>lease bucket</th><th>slots held</th><th>partitions</th><th>global debt</th><th>instances</th><th>Redis</th></tr>
{{range .Budgets}}{{if .Shared}}<tr><td class="name">{{.Name}}</td><td class="n">{{printf "%.3g" .Shared.Rate}}/s</td><td class="n">{{ms .Shared.Burst}}</td><td class="n">{{.Shared.Slots}}</td><td class="n">{{.Shared.Partitions}}</td><td class="n">{{ms .Shared.GlobalDebt}}</td><td class="n">{{.Shared.Instances}}</td><td>{{if .Shared.Fallback}}unreachable: fallback share{{else}}in sync{{end}}</td></tr>
{{end}}{{end}}</table>{{end}}
<h2>Hottest patterns</h2>
<table id="patterns"><tr><th>fingerprint</th><th>query (normalised)</th><th>count</th><th>mean cost</th><th>k</th></tr>
{{range .Patterns}}<tr><td><code>{{.Fingerprint}}</code></td><td><code>{{.Query}}</code></td><td class="n">{{.Count}}</td><td class="n">{{ms .MeanCost}}</td><td class="n">{{printf "%.3g" .K}}</td></tr>
{{else}}<tr><td class="empty" colspan="5">no costed statements yet</td></tr>
{{end}}</table>
<h2>Recent blocks</h2>
<table id="blocks"><tr><th>time</th><th>budget</th><th>reason</th><th>fingerprint</th><th>query</th></tr>
{{range .RecentBlocks}}<tr><td>{{.At.Format "15:04:05.000"}}</td><td>{{.Budget}}</td><td>{{.Reason}}</td><td><code>{{.Fingerprint}}</code></td><td><code>{{.Query}}</code></td></tr>
{{else}}<tr><td class="empty" colspan="5">none</td></tr>
{{end}}</table>
<h2>Counters</h2>
<table id="counters">
<tr><td>pattern cache hits / misses</td><td class="n">{{.Counters.PatternHits}} / {{.Counters.PatternMisses}}</td></tr>
<tr><td>EXPLAIN calls / failures</td><td class="n">{{.Counters.ExplainCalls}} / {{.Counters.ExplainFailures}}</td></tr>
<tr><td>EXPLAIN cache hits / misses</td><td class="n">{{.Counters.ExplainCacheHits}} / {{.Counters.ExplainCacheMisses}}</td></tr>
<tr><td>rule reloads / rejected</td><td class="n">{{.Counters.Reloads}} / {{.Counters.ReloadFailures}}</td></tr>
</table>
</body></html>
`))
