package integration

// Both front ends on one database, each with its own spans, metrics and log, and a tally of
// every place a decision is accounted (BudgetStatus, the pgtraffic.decisions metric,
// RecentBlocks, spans, log lines), whose deltas a test compares: one decision per statement.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// talliedEnd is one front end with what its tally reads.
type talliedEnd struct {
	name   string
	pool   *driver.Pool // nil for database/sql
	db     *sql.DB
	conn   *driver.Connector
	spans  *tracetest.InMemoryExporter
	reader *sdkmetric.ManualReader
	log    *lockedBuffer
}

func (f *talliedEnd) snapshot() driver.Snapshot {
	if f.pool != nil {
		return f.pool.Snapshot()
	}
	return f.conn.Snapshot()
}

func (f *talliedEnd) setConfig(t *testing.T, rules string) {
	t.Helper()
	var err error
	if f.pool != nil {
		err = f.pool.SetConfig(poolRules(t, rules))
	} else {
		err = f.conn.SetConfig(poolRules(t, rules))
	}
	if err != nil {
		t.Fatal(err)
	}
}

// openTallied opens both front ends on one fresh database (setup run first through a raw pgx
// connection), each at most maxConns connections.
func openTallied(t *testing.T, rules string, maxConns int32, setup string, opts ...driver.Option) (dsn string, ends []*talliedEnd) {
	t.Helper()
	dsn = pgtest.Shared(t).CreateDatabase(t)
	if setup != "" {
		raw, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = raw.Exec(context.Background(), setup)
		raw.Close(context.Background())
		if err != nil {
			t.Fatal(err)
		}
	}
	mk := func(name string) *talliedEnd {
		f := &talliedEnd{name: name, spans: tracetest.NewInMemoryExporter(), reader: sdkmetric.NewManualReader(), log: &lockedBuffer{}}
		all := append([]driver.Option{
			driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(f.spans))),
			driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))),
			driver.WithLogger(slog.New(slog.NewTextHandler(f.log, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		}, opts...)
		if rules != "" {
			all = append(all, driver.WithConfig(poolRules(t, rules)))
		}
		return f.open(t, dsn, maxConns, all)
	}
	return dsn, []*talliedEnd{mk("NewPool"), mk("Open")}
}

func (f *talliedEnd) open(t *testing.T, dsn string, maxConns int32, all []driver.Option) *talliedEnd {
	t.Helper()
	if f.name == "NewPool" {
		f.pool = openSizedPool(t, dsn, maxConns, all...)
	} else {
		f.conn, f.db = openSizedDB(t, dsn, maxConns, all...)
	}
	return f
}

// tally is every place a front end accounts decisions, at one moment.
type tally struct {
	status   map[string]int64 // budget/decision/reason from BudgetStatus (allow: reason "")
	totals   map[string]int64 // budget/decision from Admitted, Warned, Blocked
	metric   map[string]int64 // budget/decision/reason from pgtraffic.decisions
	recent   map[string]int64 // budget/decision/reason from RecentBlocks
	counters [2]int64         // Counters.Warned, Counters.Blocked
	spans    int
	spanDec  map[string]int64 // decision/budget/reason of spans (budget only for block)
	spanErr  map[string]int64 // status descriptions of spans with an error status
	logs     map[string]int64 // budget/decision of log lines
	logLines int
}

func (f *talliedEnd) tally(t *testing.T) tally {
	t.Helper()
	s := f.snapshot()
	out := tally{status: map[string]int64{}, totals: map[string]int64{}, recent: map[string]int64{},
		spanDec: map[string]int64{}, spanErr: map[string]int64{}, logs: map[string]int64{}}
	for _, b := range s.Budgets {
		out.status[b.Name+"/allow/"] += int64(b.Admitted)
		for r, n := range b.WarnedBy {
			out.status[b.Name+"/warn/"+r] += int64(n)
		}
		for r, n := range b.BlockedBy {
			out.status[b.Name+"/block/"+r] += int64(n)
		}
		out.totals[b.Name+"/allow"] += int64(b.Admitted)
		out.totals[b.Name+"/warn"] += int64(b.Warned)
		out.totals[b.Name+"/block"] += int64(b.Blocked)
	}
	for _, r := range s.RecentBlocks {
		out.recent[r.Budget+"/"+r.Decision+"/"+r.Reason] += int64(r.Count)
	}
	out.counters = [2]int64{int64(s.Counters.Warned), int64(s.Counters.Blocked)}
	var rm metricdata.ResourceMetrics
	if err := f.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	ms := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			ms[m.Name] = m
		}
	}
	out.metric = telDecisions(t, ms)
	for _, sp := range f.spans.GetSpans() {
		out.spans++
		d, b, r := telAttr(sp.Attributes, "pgtraffic.decision").AsString(), telAttr(sp.Attributes, "pgtraffic.budget").AsString(),
			telAttr(sp.Attributes, "pgtraffic.reason").AsString()
		out.spanDec[d+"/"+b+"/"+r]++
		if sp.Status.Description != "" {
			out.spanErr[sp.Status.Description]++
		}
	}
	for _, line := range strings.Split(f.log.String(), "\n") {
		if !strings.Contains(line, "pgtraffic") || !strings.Contains(line, "decision=") {
			continue
		}
		out.logLines++
		out.logs[logField(line, "budget")+"/"+logField(line, "decision")+"/"+logField(line, "reason")]++
	}
	return out
}

func logField(line, key string) string {
	i := strings.Index(line, " "+key+"=")
	if i < 0 {
		return ""
	}
	v := line[i+len(key)+2:]
	if j := strings.IndexByte(v, ' '); j >= 0 {
		v = v[:j]
	}
	return v
}

func tallySub(a, b map[string]int64) map[string]int64 {
	out := map[string]int64{}
	for k, v := range a {
		if d := v - b[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range b {
		if _, ok := a[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

// tallyDelta is what happened between two tallies.
type tallyDelta struct {
	status, totals, metric, recent, spanDec, spanErr, logs map[string]int64
	counters                                               [2]int64
	spans, logLines                                        int
}

func tallyDiff(after, before tally) tallyDelta {
	return tallyDelta{
		status: tallySub(after.status, before.status), totals: tallySub(after.totals, before.totals),
		metric: tallySub(after.metric, before.metric), recent: tallySub(after.recent, before.recent),
		spanDec: tallySub(after.spanDec, before.spanDec), spanErr: tallySub(after.spanErr, before.spanErr), logs: tallySub(after.logs, before.logs),
		counters: [2]int64{after.counters[0] - before.counters[0], after.counters[1] - before.counters[1]},
		spans:    after.spans - before.spans, logLines: after.logLines - before.logLines,
	}
}

func tallyFmt(m map[string]int64) string {
	keys := slices.Sorted(maps.Keys(m))
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%d ", k, m[k])
	}
	return "{" + strings.TrimSpace(b.String()) + "}"
}

func (d tallyDelta) String() string {
	return fmt.Sprintf("status %s\n totals %s\n metric %s\n recent %s\n counters warned=%d blocked=%d\n spans %d %s errors %s\n logs %d %s",
		tallyFmt(d.status), tallyFmt(d.totals), tallyFmt(d.metric), tallyFmt(d.recent), d.counters[0], d.counters[1],
		d.spans, tallyFmt(d.spanDec), tallyFmt(d.spanErr), d.logLines, tallyFmt(d.logs))
}

// metricOf is the metric delta restricted to the budgets the status lists.
func (d tallyDelta) metricOf(budgets ...string) map[string]int64 {
	out := map[string]int64{}
	for k, v := range d.metric {
		for _, b := range budgets {
			if strings.HasPrefix(k, b+"/") {
				out[k] = v
			}
		}
	}
	return out
}

func errorsAs(err error, be **driver.BlockedError) bool { return errors.As(err, be) }
