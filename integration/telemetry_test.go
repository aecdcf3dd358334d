package integration

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Secrets that must never reach telemetry: a literal in the SQL text and a bound value.
const (
	telLiteral = "hunter2literal"
	telBound   = "boundsecret7781"
)

const telRules = `
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 1
    per_query_limit: 10s
rules:
  - budget: reporting
    match: {app: reporting}
`

// telSetup is a pgtraffic connector on a fresh database with an orders table, recording spans,
// metrics and logs.
type telSetup struct {
	db     *sql.DB
	conn   *driver.Connector
	srv    *pgtest.Server
	dbName string
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	log    *lockedBuffer
}

func newTelSetup(t *testing.T, rules string, opts ...driver.Option) *telSetup {
	t.Helper()
	s := &telSetup{
		srv:    pgtest.Shared(t),
		spans:  tracetest.NewInMemoryExporter(),
		reader: sdkmetric.NewManualReader(),
		log:    &lockedBuffer{},
	}
	dsn := s.srv.CreateDatabase(t)
	cc, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	s.dbName = cc.Database
	s.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(s.spans))
	all := []driver.Option{
		driver.WithTracerProvider(s.tp),
		driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(s.reader))),
		// Debug level: the statement and EXPLAIN-failure logs must be free of secrets too.
		driver.WithLogger(slog.New(slog.NewTextHandler(s.log, &slog.HandlerOptions{Level: slog.LevelDebug}))),
	}
	if rules != "" {
		cfg, err := driver.ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, driver.WithConfig(cfg))
	}
	s.conn, err = driver.NewConnector(dsn, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	s.db = sql.OpenDB(s.conn)
	t.Cleanup(func() { s.db.Close() })
	if _, err := s.db.Exec(`CREATE TABLE orders (id int PRIMARY KEY, note text);
		INSERT INTO orders SELECT g, 'note ' || g FROM generate_series(1, 1000) g`); err != nil {
		t.Fatal(err)
	}
	s.spans.Reset()
	return s
}

func (s *telSetup) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := s.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

func telAttr(attrs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range attrs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

// telSpan returns the only span whose pgtraffic.tag.step is step.
func telSpan(t *testing.T, spans tracetest.SpanStubs, step string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range spans {
		if telAttr(s.Attributes, "pgtraffic.tag.step").AsString() == step {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d spans for step %q, want 1", len(found), step)
	}
	return found[0]
}

// TestTelemetryAgainstPostgres checks spans, metrics and logs for statements that run, are
// costed with a real EXPLAIN, fail on the server and are blocked, and that no literal or bound
// value appears anywhere in them.
func TestTelemetryAgainstPostgres(t *testing.T) {
	s := newTelSetup(t, telRules)
	ctx, parent := s.tp.Tracer("test").Start(context.Background(), "request")
	step := func(name string, kv ...string) context.Context {
		return tagging.With(ctx, append([]string{"step", name}, kv...)...)
	}
	q := "SELECT count(*) FROM orders WHERE note <> '" + telLiteral + "' AND note <> $1"

	var n int
	if err := s.db.QueryRowContext(step("costed", "app", "reporting"), q, telBound).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1000 {
		t.Fatalf("count %d", n)
	}
	// The server's message quotes the bound value: invalid input syntax for type integer: "...".
	_, err := s.db.ExecContext(step("server-error"), "SELECT $1::int FROM orders WHERE note = '"+telLiteral+"'", telBound)
	if err == nil {
		t.Fatal("want invalid input syntax")
	}
	// EXPLAIN fails on the bad bound value (and so does the statement): the EXPLAIN failure is
	// logged at debug level, with the SQLSTATE and never the server's message.
	_, err = s.db.ExecContext(step("explain-fails", "app", "reporting"), "SELECT count(*) FROM orders WHERE id = $1", telBound)
	if err == nil {
		t.Fatal("want invalid input syntax")
	}
	// Block: the held statement occupies reporting's only slot.
	held, err := s.db.QueryContext(step("held", "app", "reporting"), "SELECT id FROM orders WHERE note <> $1", telBound)
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.db.ExecContext(step("blocked", "app", "reporting"), q, telBound)
	asBlocked(t, err)
	held.Close()
	parent.End()

	spans := s.spans.GetSpans()
	t.Run("spans", func(t *testing.T) {
		for _, st := range []string{"costed", "server-error", "held", "blocked"} {
			sp := telSpan(t, spans, st)
			if sp.SpanKind != trace.SpanKindClient || sp.Parent.SpanID() != parent.SpanContext().SpanID() {
				t.Errorf("%s: kind %v, parent %v; want a client child of the caller's span", st, sp.SpanKind, sp.Parent.SpanID())
			}
			want := map[string]string{
				"db.system.name": "postgresql",
				"db.namespace":   s.dbName,
				"server.address": s.srv.Host,
				"server.port":    strconv.Itoa(s.srv.Port),
			}
			for k, v := range want {
				if got := telAttr(sp.Attributes, k).String(); got != v {
					t.Errorf("%s: %s = %q, want %q", st, k, got, v)
				}
			}
		}
		costed := telSpan(t, spans, "costed")
		if costed.Name != "SELECT orders" || telAttr(costed.Attributes, "db.query.text").AsString() != "SELECT count(*) FROM orders WHERE note <> $2 AND note <> $1" {
			t.Errorf("costed: name %q, text %q", costed.Name, telAttr(costed.Attributes, "db.query.text").String())
		}
		if telAttr(costed.Attributes, "pgtraffic.plan_cost").AsFloat64() <= 0 || telAttr(costed.Attributes, "pgtraffic.decision").AsString() != "allow" {
			t.Errorf("costed: plan_cost %s, decision %s; want a real EXPLAIN cost and allow",
				telAttr(costed.Attributes, "pgtraffic.plan_cost").String(), telAttr(costed.Attributes, "pgtraffic.decision").String())
		}
		se := telSpan(t, spans, "server-error")
		if se.Status.Code != codes.Error || telAttr(se.Attributes, "db.response.status_code").AsString() != "22P02" ||
			telAttr(se.Attributes, "error.type").AsString() != "22P02" {
			t.Errorf("server error: status %v, code %s, error.type %s", se.Status.Code,
				telAttr(se.Attributes, "db.response.status_code").String(), telAttr(se.Attributes, "error.type").String())
		}
		bl := telSpan(t, spans, "blocked")
		if bl.Status.Code != codes.Error || telAttr(bl.Attributes, "pgtraffic.decision").AsString() != "block" ||
			telAttr(bl.Attributes, "pgtraffic.reason").AsString() != driver.ReasonConcurrency {
			t.Errorf("blocked: status %v, decision %s, reason %s", bl.Status.Code,
				telAttr(bl.Attributes, "pgtraffic.decision").String(), telAttr(bl.Attributes, "pgtraffic.reason").String())
		}
	})

	m := s.metrics(t)
	t.Run("metrics", func(t *testing.T) {
		var count uint64
		for _, dp := range m["db.client.operation.duration"].Data.(metricdata.Histogram[float64]).DataPoints {
			if op, _ := dp.Attributes.Value("db.operation.name"); op.AsString() == "SELECT" { // not the set-up's DDL
				count += dp.Count
			}
			if v, _ := dp.Attributes.Value("server.port"); v.AsInt64() != int64(s.srv.Port) {
				t.Errorf("duration server.port %s", v.String())
			}
		}
		if count != 4 { // costed, server-error, explain-fails, held; the blocked one never ran
			t.Errorf("%d durations recorded, want 4", count)
		}
		decisions := map[string]int64{}
		for _, dp := range m["pgtraffic.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
			d, _ := dp.Attributes.Value("pgtraffic.decision")
			decisions[d.AsString()] += dp.Value
		}
		if decisions["allow"] != 3 || decisions["block"] != 1 {
			t.Errorf("decisions %v, want allow=3 block=1", decisions)
		}
	})

	t.Run("no secrets", func(t *testing.T) {
		var texts []string
		for _, sp := range spans {
			texts = append(texts, sp.Name, sp.Status.Description)
			for _, kv := range sp.Attributes {
				texts = append(texts, string(kv.Key)+"="+kv.Value.String())
			}
			for _, e := range sp.Events {
				for _, kv := range e.Attributes {
					texts = append(texts, e.Name+" "+string(kv.Key)+"="+kv.Value.String())
				}
			}
		}
		for _, mm := range m {
			texts = append(texts, fmt.Sprintf("%s %+v", mm.Name, mm.Data))
		}
		texts = append(texts, s.log.String())
		for _, want := range []string{"decision=block", "EXPLAIN failed", "SQLSTATE 22P02"} {
			if !strings.Contains(s.log.String(), want) {
				t.Fatalf("log lacks %q:\n%s", want, s.log.String())
			}
		}
		for _, text := range texts {
			for _, secret := range []string{telLiteral, telBound} {
				if strings.Contains(text, secret) {
					t.Errorf("telemetry contains %q: %s", secret, text)
				}
			}
		}
	})
}

// TestTelemetryGaugesThroughConnector checks the observable gauges and counters of a connector
// made by NewConnector, and that closing it stops them.
func TestTelemetryGaugesThroughConnector(t *testing.T) {
	s := newTelSetup(t, telRules)
	reporting := tagging.With(context.Background(), "app", "reporting")
	for range 3 {
		if _, err := s.db.ExecContext(reporting, "SELECT count(*) FROM orders WHERE id < $1", 10); err != nil {
			t.Fatal(err)
		}
	}
	held, err := s.db.QueryContext(reporting, "SELECT id FROM orders")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	m := s.metrics(t)
	sum := func(name string) int64 {
		t.Helper()
		mm, ok := m[name]
		if !ok {
			t.Fatalf("no %s (the connector must attach its gauges)", name)
		}
		var v int64
		for _, dp := range mm.Data.(metricdata.Sum[int64]).DataPoints {
			v += dp.Value
		}
		return v
	}
	if got := sum("pgtraffic.explain.calls"); got < 1 {
		t.Errorf("explain calls %d, want at least 1", got)
	}
	if got := sum("pgtraffic.explain.cache_hits"); got < 1 {
		t.Errorf("explain cache hits %d, want at least 1 (auto mode caches per pattern)", got)
	}
	if got := sum("pgtraffic.pattern_cache.hits"); got < 2 {
		t.Errorf("pattern cache hits %d, want at least 2", got)
	}
	if got := sum("pgtraffic.rules.reloads"); got != 1 {
		t.Errorf("reloads %d, want 1", got)
	}
	inFlight := m["pgtraffic.budget.in_flight"].Data.(metricdata.Gauge[int64]).DataPoints
	if len(inFlight) != 1 || inFlight[0].Value != 1 {
		t.Errorf("in_flight points %+v, want reporting=1", inFlight)
	}
	debt := m["pgtraffic.budget.debt"].Data.(metricdata.Gauge[float64]).DataPoints
	if b, _ := debt[0].Attributes.Value("pgtraffic.budget"); len(debt) != 1 || b.AsString() != "reporting" {
		t.Errorf("debt points %+v", debt)
	}
	held.Close()
	if err := s.db.Close(); err != nil {
		t.Fatal(err)
	}
	if mm, ok := s.metrics(t)["pgtraffic.budget.debt"]; ok && len(mm.Data.(metricdata.Gauge[float64]).DataPoints) > 0 {
		t.Errorf("gauges still reported after the connector was closed")
	}
}

// selfQuery returns the text of the statement running it, as pg_stat_activity shows it to
// server-side tools. $1 is a bound value that must not appear there.
const selfQuery = "SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid() AND $1::text <> ''"

// TestSQLCommenterServerSide checks what pg_stat_activity shows with WithSQLCommenter: the
// application's text plus its context tags and the statement's traceparent, and no bound value.
func TestSQLCommenterServerSide(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprint("commenter=", on), func(t *testing.T) {
			s := newTelSetup(t, "", driver.WithSQLCommenter(on))
			ctx := tagging.With(context.Background(), "app", "web", "route", "/orders/{id}")
			var seen string
			if err := s.db.QueryRowContext(ctx, selfQuery, telBound).Scan(&seen); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(seen, telBound) {
				t.Fatalf("pg_stat_activity shows the bound value: %s", seen)
			}
			if !on {
				if seen != selfQuery {
					t.Fatalf("commenter off: server saw %q, want the text unchanged", seen)
				}
				return
			}
			spans := s.spans.GetSpans()
			if len(spans) != 1 {
				t.Fatalf("%d spans", len(spans))
			}
			sc := spans[0].SpanContext
			wantTP := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
			tags := tagging.Parse(seen)
			got := map[string]string{}
			for k, v := range tags.All() {
				got[k] = v
			}
			want := map[string]string{"app": "web", "route": "/orders/{id}", "traceparent": wantTP}
			if !maps.Equal(got, want) {
				t.Fatalf("comment tags %v, want %v (text %q)", got, want, seen)
			}
			if !strings.HasPrefix(seen, selfQuery+" /*") {
				t.Fatalf("server saw %q", seen)
			}
		})
	}
}

// prepareCounter counts the statements pgx prepares on the server (Parse messages), through
// pgx's tracer hooks.
type prepareCounter struct{ n atomic.Int64 }

func (p *prepareCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}
func (p *prepareCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (p *prepareCounter) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}
func (p *prepareCounter) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if d.Err == nil && !d.AlreadyPrepared {
		p.n.Add(1)
	}
}

// commenterDB opens pgtraffic on dsn on a single connection, counting prepared statements.
func commenterDB(tb testing.TB, dsn string, commenter bool, sampler sdktrace.Sampler) (*sql.DB, *prepareCounter) {
	tb.Helper()
	pc := &prepareCounter{}
	db, err := driver.Open(dsn,
		driver.WithSQLCommenter(commenter),
		driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler))),
		driver.WithPgxOptions(stdlib.OptionBeforeConnect(func(_ context.Context, cc *pgx.ConnConfig) error {
			cc.Tracer = pc
			return nil
		})))
	if err != nil {
		tb.Fatal(err)
	}
	db.SetMaxOpenConns(1) // one connection, one pgx statement cache
	tb.Cleanup(func() { db.Close() })
	return db, pc
}

// TestSQLCommenterPreparedStatements shows why the commenter is off by default: with a
// per-request traceparent every statement text is new to pgx's statement cache, so every
// execution prepares a statement on the server.
func TestSQLCommenterPreparedStatements(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	const runs = 20
	tests := []struct {
		name      string
		commenter bool
		sampler   sdktrace.Sampler
		prepares  int64
	}{
		{"off", false, sdktrace.AlwaysSample(), 1},
		{"on, unsampled: constant tags only", true, sdktrace.NeverSample(), 1},
		{"on, sampled: a traceparent per request", true, sdktrace.AlwaysSample(), runs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			db, pc := commenterDB(t, dsn, tt.commenter, tt.sampler)
			ctx := tagging.With(context.Background(), "app", "web")
			for i := range runs {
				var v int
				if err := db.QueryRowContext(ctx, "SELECT $1::int + 1", i).Scan(&v); err != nil {
					t.Fatal(err)
				}
			}
			if got := pc.n.Load(); got != tt.prepares {
				t.Fatalf("%d prepared statements for %d executions, want %d", got, runs, tt.prepares)
			}
		})
	}
}

// BenchmarkSQLCommenter measures one statement through pgtraffic, each variant on its own
// single connection: the commenter off; on with a per-request traceparent (every span
// sampled) in pgx's default cache_statement mode; the same in exec mode (no statement cache);
// and on with constant tags only (spans unsampled, so no traceparent). Every span-sampled
// variant records spans the same way, so off and traceparent differ only by the comment.
//
// The variants run interleaved, in batches of 50 statements, and each reports its fastest
// batch per statement (…-ns/stmt): on a shared, loaded machine that is far steadier than
// separate benchmarks. …-prepares/stmt counts statements pgx prepared on the server.
// Run enough iterations to fill pgx's 512-entry statement cache:
//
//	go test -run '^$' -bench SQLCommenter -benchtime 100x ./integration
func BenchmarkSQLCommenter(b *testing.B) {
	base := pgtest.Shared(b).CreateDatabase(b)
	execDSN := base + "&default_query_exec_mode=exec"
	if !strings.Contains(base, "?") {
		execDSN = base + "?default_query_exec_mode=exec"
	}
	type variant struct {
		name string
		db   *sql.DB
		pc   *prepareCounter
		best time.Duration
		prep int64
	}
	var vs []*variant
	for _, v := range []struct {
		name      string
		dsn       string
		commenter bool
		sampler   sdktrace.Sampler
	}{
		{"off", base, false, sdktrace.AlwaysSample()},
		{"traceparent", base, true, sdktrace.AlwaysSample()},
		{"traceparent-exec", execDSN, true, sdktrace.AlwaysSample()},
		{"tags-only", base, true, sdktrace.NeverSample()},
	} {
		db, pc := commenterDB(b, v.dsn, v.commenter, v.sampler)
		vs = append(vs, &variant{name: v.name, db: db, pc: pc, best: time.Hour})
	}
	ctx := tagging.With(context.Background(), "app", "web")
	const batch = 50
	var v, i int
	for _, x := range vs { // connect, and prepare the constant text once
		if err := x.db.QueryRowContext(ctx, "SELECT $1::int + 1", 0).Scan(&v); err != nil {
			b.Fatal(err)
		}
		x.prep = x.pc.n.Load()
	}
	stmts := 0
	b.ReportAllocs()
	for b.Loop() {
		for _, x := range vs {
			t0 := time.Now()
			for range batch {
				i++
				if err := x.db.QueryRowContext(ctx, "SELECT $1::int + 1", i).Scan(&v); err != nil {
					b.Fatal(err)
				}
			}
			x.best = min(x.best, time.Since(t0))
		}
		stmts += batch
	}
	for _, x := range vs {
		b.ReportMetric(float64(x.best.Nanoseconds())/batch, x.name+"-ns/stmt")
		b.ReportMetric(float64(x.pc.n.Load()-x.prep)/float64(stmts), x.name+"-prepares/stmt")
	}
}

// Tags from a client reach spans only as valid UTF-8 and bounded: a
// request for "/%FF%FE" or an 8 KB path through tagging.Middleware, and a comment holding
// invalid UTF-8 and a 10 KB value, against a real server. OTLP's protobuf refuses a string that
// is not UTF-8 and its exporters then drop the whole batch.
func TestTelemetryUntrustedTagsAgainstPostgres(t *testing.T) {
	s := newTelSetup(t, telRules)
	comment := "/*bad='%FF%FE',note='" + strings.Repeat("n", 10<<10) + "'*/"
	srv := httptest.NewServer(tagging.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := tagging.With(r.Context(), "step", "http")
		var n int
		if err := s.db.QueryRowContext(ctx, "SELECT count(*) FROM orders "+comment).Scan(&n); err != nil || n != 1000 {
			t.Errorf("count %d, %v", n, err)
		}
		// The server refuses invalid UTF-8 in the text; the span must still be exportable.
		_, _ = s.db.ExecContext(ctx, "SELECT 1 AS \"caf\xff\" FROM orders")
	})))
	defer srv.Close()
	for _, path := range []string{"/%FF%FE", "/" + strings.Repeat("r", 8<<10)} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}

	spans := s.spans.GetSpans()
	var routes []string
	for _, sp := range spans {
		if telAttr(sp.Attributes, "pgtraffic.tag.step").AsString() != "http" {
			continue
		}
		if !utf8.ValidString(sp.Name) || !utf8.ValidString(sp.Status.Description) {
			t.Errorf("span name or status %q / %q not UTF-8", sp.Name, sp.Status.Description)
		}
		for _, kv := range sp.Attributes {
			vals := kv.Value.AsStringSlice()
			if kv.Value.Type() == attribute.STRING {
				vals = []string{kv.Value.AsString()}
			}
			if !utf8.ValidString(string(kv.Key)) {
				t.Errorf("attribute key %q not UTF-8", kv.Key)
			}
			for _, v := range vals {
				if !utf8.ValidString(v) {
					t.Errorf("attribute %s = %q not UTF-8", kv.Key, v)
				}
				if strings.HasPrefix(string(kv.Key), "pgtraffic.tag.") && len(v) > 256 {
					t.Errorf("tag attribute %s of %d bytes", kv.Key, len(v))
				}
			}
		}
		if r := telAttr(sp.Attributes, "pgtraffic.tag.route").AsString(); !slices.Contains(routes, r) {
			routes = append(routes, r)
		}
	}
	if want := []string{"/\uFFFD", "/" + strings.Repeat("r", 255)}; !slices.Equal(routes, want) {
		t.Errorf("routes %.60q, want %.60q", routes, want)
	}
	if n := len(spans); n < 4 {
		t.Errorf("%d spans, want 4 statements' spans", n)
	}
}
