package driver

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	"github.com/pgtraffic/pgtraffic/tagging"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// The telemetry tests run real statements through database/sql and the pgtraffic connection
// down to a fake driver.Conn (no server), with an in-memory span exporter, a manual metric
// reader, a captured log and a fake clock.

// telLog collects log output from many goroutines.
type telLog struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (l *telLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *telLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// telSent records the statement texts the fake connection received, and the contexts it
// received them under.
type telSent struct {
	mu    sync.Mutex // protects texts and ctxs
	texts []string
	ctxs  []context.Context
}

func (s *telSent) add(ctx context.Context, q string) {
	s.mu.Lock()
	s.texts = append(s.texts, q)
	s.ctxs = append(s.ctxs, ctx)
	s.mu.Unlock()
}

func (s *telSent) contexts() []context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.ctxs)
}

func (s *telSent) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.texts)
}

// telFailMarker in a statement makes the fake connection answer with a server error whose
// message quotes the first bound value, as PostgreSQL's "invalid input syntax" errors do.
const telFailMarker = "fail_here"

// telConnector, telConn, telStmt and telRows are a fake pgx: every statement succeeds (a query
// returns two rows) unless it contains telFailMarker.
type telConnector struct{ sent *telSent }

func (c telConnector) Connect(context.Context) (driver.Conn, error) {
	return &telConn{sent: c.sent}, nil
}
func (c telConnector) Driver() driver.Driver { return nil }

type telConn struct{ sent *telSent }

var (
	_ driver.ExecerContext      = (*telConn)(nil)
	_ driver.QueryerContext     = (*telConn)(nil)
	_ driver.ConnPrepareContext = (*telConn)(nil)
)

func (c *telConn) Prepare(query string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), query)
}
func (c *telConn) PrepareContext(_ context.Context, query string) (driver.Stmt, error) {
	return &telStmt{c: c, query: query}, nil
}
func (c *telConn) Close() error              { return nil }
func (c *telConn) Begin() (driver.Tx, error) { return nil, errors.New("telConn: no transactions") }
func (c *telConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return nil, errors.New("telConn: no transactions")
}
func (c *telConn) Ping(context.Context) error               { return nil }
func (c *telConn) ResetSession(context.Context) error       { return nil }
func (c *telConn) CheckNamedValue(*driver.NamedValue) error { return nil }

func (c *telConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	c.sent.add(ctx, query)
	if err := telAnswer(query, args); err != nil {
		return nil, err
	}
	return driver.RowsAffected(1), nil
}

func (c *telConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	c.sent.add(ctx, query)
	if err := telAnswer(query, args); err != nil {
		return nil, err
	}
	return &telRows{left: 2}, nil
}

func telAnswer(query string, args []driver.NamedValue) error {
	if !strings.Contains(query, telFailMarker) {
		return nil
	}
	v := any("")
	if len(args) > 0 {
		v = args[0].Value
	}
	return &pgconn.PgError{Severity: "ERROR", Code: "22P02",
		Message: fmt.Sprintf("invalid input syntax for type integer: %q", v)}
}

type telStmt struct {
	c     *telConn
	query string
}

func (s *telStmt) Close() error  { return nil }
func (s *telStmt) NumInput() int { return -1 }
func (s *telStmt) Exec([]driver.Value) (driver.Result, error) {
	return nil, errors.New("telStmt: use ExecContext")
}
func (s *telStmt) Query([]driver.Value) (driver.Rows, error) {
	return nil, errors.New("telStmt: use QueryContext")
}
func (s *telStmt) ExecContext(ctx context.Context, args []driver.NamedValue) (driver.Result, error) {
	return s.c.ExecContext(ctx, s.query, args)
}
func (s *telStmt) QueryContext(ctx context.Context, args []driver.NamedValue) (driver.Rows, error) {
	return s.c.QueryContext(ctx, s.query, args)
}

type telRows struct{ left int }

func (r *telRows) Columns() []string { return []string{"id"} }
func (r *telRows) Close() error      { return nil }
func (r *telRows) Next(dest []driver.Value) error {
	if r.left == 0 {
		return io.EOF
	}
	r.left--
	dest[0] = int64(r.left)
	return nil
}

// telHarness is a connector over the fake driver with recording telemetry.
type telHarness struct {
	db     *sql.DB
	conn   *Connector
	eng    *engine.Engine
	rt     *runtime.Runtime
	tel    *telemetry
	spans  *tracetest.InMemoryExporter
	tp     *sdktrace.TracerProvider
	reader *sdkmetric.ManualReader
	log    *telLog
	clock  *fakeclock.Clock
	sent   *telSent
}

// telDSN is the connection the harness pretends to use: its host, port and database become
// server.address, server.port and db.namespace.
const telDSN = "postgres://app@db.example:5433/shop"

const telRules = `
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 1
  - name: audit
    mode: warn
    max_concurrent: 1
  - name: costed
    mode: warn
    per_query_limit: 1h
rules:
  - budget: reporting
    match: {app: reporting}
  - budget: audit
    match: {app: audit}
  - budget: costed
    match: {app: costed}
guards:
  require_where: enforce
`

func newTelHarness(t testing.TB, rules string, opts ...Option) *telHarness {
	t.Helper()
	h := &telHarness{
		spans:  tracetest.NewInMemoryExporter(),
		reader: sdkmetric.NewManualReader(),
		log:    &telLog{},
		clock:  fakeclock.New(),
		sent:   &telSent{},
	}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSyncer(h.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))
	var o options
	for _, opt := range append([]Option{WithTracerProvider(h.tp), WithMeterProvider(mp),
		WithLogger(slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})))}, opts...) {
		opt(&o)
	}
	cc, err := pgx.ParseConfig(telDSN)
	if err != nil {
		t.Fatal(err)
	}
	h.tel, err = newTelemetry(&o, cc)
	if err != nil {
		t.Fatal(err)
	}
	h.eng = engine.New(engine.Options{
		Logger: o.logger, Now: h.clock.Now, User: cc.User, Database: cc.Database,
		Observer: h.tel.observer(),
	})
	h.rt = runtime.New(h.eng, runtime.Options{})
	if rules != "" {
		cfg, err := ParseConfig([]byte(rules))
		if err != nil {
			t.Fatal(err)
		}
		if err := h.rt.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.tel.attach(h.rt); err != nil {
		t.Fatal(err)
	}
	intr := &interceptor{engine: h.eng, commenter: o.sqlCommenter}
	h.conn = &Connector{core: &core{engine: h.eng, rt: h.rt, intr: intr, tel: h.tel}, pgx: telConnector{sent: h.sent}}
	h.db = sql.OpenDB(h.conn)
	t.Cleanup(func() {
		h.db.Close()
		if err := h.tel.close(); err != nil {
			t.Error(err)
		}
	})
	return h
}

// hold runs a query under ctx and keeps its rows open, holding a slot in its budgets, until
// the returned function is called.
func (h *telHarness) hold(t *testing.T, ctx context.Context) func() {
	t.Helper()
	rows, err := h.db.QueryContext(ctx, "SELECT id FROM orders WHERE id = $1", 1)
	if err != nil {
		t.Fatal(err)
	}
	return func() { rows.Close() }
}

// span returns the only ended span whose name and pgtraffic.tag.app match.
func (h *telHarness) span(t *testing.T, name, app string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range h.spans.GetSpans() {
		if s.Name == name && attrOf(s.Attributes, "pgtraffic.tag.app").String() == app {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("spans named %q with app=%q: %d, want 1 (all: %v)", name, app, len(found), spanNames(h.spans.GetSpans()))
	}
	return found[0]
}

func spanNames(ss tracetest.SpanStubs) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.Name)
	}
	return out
}

func attrOf(attrs []attribute.KeyValue, key string) attribute.Value {
	for _, kv := range attrs {
		if string(kv.Key) == key {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func hasAttr(attrs []attribute.KeyValue, key string) bool {
	return attrOf(attrs, key).Type() != attribute.EMPTY
}

func (h *telHarness) metrics(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := h.reader.Collect(context.Background(), &rm); err != nil {
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

func TestSpans(t *testing.T) {
	h := newTelHarness(t, telRules)
	parentCtx, parent := h.tp.Tracer("test").Start(context.Background(), "request")

	// An allowed query, run to the end of its rows.
	var n int
	rows, err := h.db.QueryContext(tagging.With(parentCtx, "app", "web", "route", "/orders"),
		"SELECT id FROM orders WHERE note = 'x' AND id = $1", 7)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		n++
	}
	rows.Close()

	// A block: the reporting budget admits one statement at a time.
	reporting := tagging.With(parentCtx, "app", "reporting")
	release := h.hold(t, reporting)
	_, err = h.db.ExecContext(reporting, "UPDATE orders SET note = $1 WHERE id = $2", "n", 1)
	if !errors.Is(err, ErrBlocked) {
		t.Fatalf("reporting over max_concurrent: %v, want ErrBlocked", err)
	}
	release()

	// A warn: the audit budget is warn-only, so the second statement runs with a warning.
	audit := tagging.With(parentCtx, "app", "audit")
	release = h.hold(t, audit)
	if _, err := h.db.ExecContext(audit, "DELETE FROM orders WHERE id = $1", 3); err != nil {
		t.Fatalf("warn budget must let the statement run: %v", err)
	}
	release()

	// A server error.
	if _, err := h.db.ExecContext(tagging.With(parentCtx, "app", "failing"),
		"UPDATE orders SET fail_here = 1 WHERE id = $1", "x"); err == nil {
		t.Fatal("the fake server error was not returned")
	}

	// A costed budget: the prediction is recorded.
	if _, err := h.db.ExecContext(tagging.With(parentCtx, "app", "costed"), "SELECT 1 FROM items"); err != nil {
		t.Fatal(err)
	}
	parent.End()
	if n != 2 {
		t.Fatalf("rows: %d, want 2", n)
	}

	common := map[string]string{
		"db.system.name": "postgresql",
		"db.namespace":   "shop",
		"server.address": "db.example",
		"server.port":    "5433",
	}
	tests := []struct {
		name, span, app string
		want            map[string]string // attribute -> value as String() prints it
		absent          []string
		status          codes.Code
		event           string
	}{
		{
			name: "allow", span: "SELECT orders", app: "web",
			want: map[string]string{
				"db.query.text":       "SELECT id FROM orders WHERE note = $2 AND id = $1",
				"db.query.summary":    "SELECT orders",
				"db.operation.name":   "SELECT",
				"db.collection.name":  "orders",
				"pgtraffic.decision":  "allow",
				"pgtraffic.tag.route": "/orders",
				"pgtraffic.tag.table": "orders",
			},
			absent: []string{"error.type", "pgtraffic.reason", "pgtraffic.budgets", "pgtraffic.predicted_cost_s", "pgtraffic.tag.fingerprint"},
			status: codes.Unset,
		},
		{
			name: "block", span: "UPDATE orders", app: "reporting",
			want: map[string]string{
				"pgtraffic.decision": "block",
				"pgtraffic.reason":   "concurrency",
				"pgtraffic.budgets":  `["reporting"]`,
				"pgtraffic.budget":   "reporting",
				"error.type":         "pgtraffic.blocked",
				"db.query.text":      "UPDATE orders SET note = $1 WHERE id = $2",
			},
			status: codes.Error,
		},
		{
			name: "warn", span: "DELETE orders", app: "audit",
			want: map[string]string{
				"pgtraffic.decision": "warn",
				"pgtraffic.reason":   "concurrency",
				"pgtraffic.budgets":  `["audit"]`,
			},
			absent: []string{"error.type"},
			status: codes.Unset,
			event:  "pgtraffic.warn",
		},
		{
			name: "server error", span: "UPDATE orders", app: "failing",
			want: map[string]string{
				"error.type":              "22P02",
				"db.response.status_code": "22P02",
				"pgtraffic.decision":      "allow",
			},
			status: codes.Error,
		},
		{
			name: "costed", span: "SELECT items", app: "costed",
			want:   map[string]string{"pgtraffic.budgets": `["costed"]`, "pgtraffic.predicted_cost_s": "0"},
			status: codes.Unset,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := h.span(t, tt.span, tt.app)
			if s.SpanKind != trace.SpanKindClient {
				t.Errorf("kind %v, want client", s.SpanKind)
			}
			// A statement that matched a budget starts its span when admission began (the
			// engine's fake clock); one on the fast path starts it on the wall clock.
			if atAdmission := s.StartTime.Equal(h.clock.Now()); atAdmission != hasAttr(s.Attributes, "pgtraffic.budgets") {
				t.Errorf("start %v (engine clock %v), budgets %s", s.StartTime, h.clock.Now(), attrOf(s.Attributes, "pgtraffic.budgets").String())
			}
			if s.Parent.SpanID() != parent.SpanContext().SpanID() || s.SpanContext.TraceID() != parent.SpanContext().TraceID() {
				t.Errorf("span is not a child of the caller's span")
			}
			for k, v := range common {
				if got := attrOf(s.Attributes, k).String(); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			for k, v := range tt.want {
				if got := attrOf(s.Attributes, k).String(); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			for _, k := range tt.absent {
				if hasAttr(s.Attributes, k) {
					t.Errorf("%s is set (%s), want absent", k, attrOf(s.Attributes, k).String())
				}
			}
			if len(attrOf(s.Attributes, "pgtraffic.fingerprint").AsString()) != 16 {
				t.Errorf("pgtraffic.fingerprint = %q, want 16 hex digits", attrOf(s.Attributes, "pgtraffic.fingerprint").String())
			}
			if s.Status.Code != tt.status {
				t.Errorf("status %v (%q), want %v", s.Status.Code, s.Status.Description, tt.status)
			}
			var events []string
			for _, e := range s.Events {
				events = append(events, e.Name)
			}
			if tt.event != "" && !slices.Contains(events, tt.event) {
				t.Errorf("events %v, want %s", events, tt.event)
			}
			if tt.event == "" && len(events) > 0 {
				t.Errorf("events %v, want none", events)
			}
		})
	}
}

func TestSpansUseGlobalProviderByDefault(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	old := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	t.Cleanup(func() { otel.SetTracerProvider(old) })

	var o options
	o.meterProvider = metricnoop.NewMeterProvider()
	cc, err := pgx.ParseConfig(telDSN)
	if err != nil {
		t.Fatal(err)
	}
	tel, err := newTelemetry(&o, cc)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{Observer: tel.observer()})
	x := new(engine.Exec)
	ctx, err := eng.Begin(context.Background(), x, nil, "SELECT 1 FROM t", nil)
	if err != nil {
		t.Fatal(err)
	}
	x.Finish(ctx, nil)
	if got := spanNames(exp.GetSpans()); !slices.Equal(got, []string{"SELECT t"}) {
		t.Fatalf("spans through the global provider: %v, want [SELECT t]", got)
	}
}

func TestUnparsableStatementSpan(t *testing.T) {
	h := newTelHarness(t, "")
	if _, err := h.db.ExecContext(tagging.With(context.Background(), "app", "x"), "SELEC 'secret' FROM"); err != nil {
		t.Fatal(err)
	}
	s := h.span(t, "postgresql", "x")
	for _, k := range []string{"db.query.text", "db.query.summary", "db.operation.name", "db.collection.name"} {
		if hasAttr(s.Attributes, k) {
			t.Errorf("%s = %q for unparsable text, want absent", k, attrOf(s.Attributes, k).String())
		}
	}
}

func TestMetrics(t *testing.T) {
	h := newTelHarness(t, telRules)
	ctx := context.Background()
	if _, err := h.db.ExecContext(ctx, "SELECT 1 FROM orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.ExecContext(ctx, "SELECT 1 FROM orders"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.db.ExecContext(ctx, "UPDATE orders SET fail_here = 1 WHERE id = $1", 1); err == nil {
		t.Fatal("no server error")
	}
	reporting := tagging.With(ctx, "app", "reporting")
	release := h.hold(t, reporting)
	if _, err := h.db.ExecContext(reporting, "SELECT 1 FROM orders"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("want a block, got %v", err)
	}
	if _, err := h.db.ExecContext(ctx, "DELETE FROM orders"); !errors.Is(err, ErrBlocked) {
		t.Fatalf("require_where: want a block, got %v", err)
	}
	m := h.metrics(t) // collected while the reporting statement holds its slot
	release()

	t.Run("duration", func(t *testing.T) {
		d, ok := m["db.client.operation.duration"]
		if !ok {
			t.Fatal("no db.client.operation.duration")
		}
		if d.Unit != "s" {
			t.Errorf("unit %q, want s", d.Unit)
		}
		hist := d.Data.(metricdata.Histogram[float64])
		var total uint64
		var errored bool
		for _, dp := range hist.DataPoints {
			if !slices.Equal(dp.Bounds, []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}) {
				t.Errorf("bounds %v", dp.Bounds)
			}
			total += dp.Count
			if v, ok := dp.Attributes.Value("error.type"); ok && v.AsString() == "22P02" {
				errored = true
			}
			if v, _ := dp.Attributes.Value("db.system.name"); v.AsString() != "postgresql" {
				t.Errorf("db.system.name = %q", v.String())
			}
		}
		if total != 3 { // the two selects and the failing update; blocked statements never ran
			t.Errorf("recorded %d durations, want 3", total)
		}
		if !errored {
			t.Error("no data point with error.type=22P02")
		}
	})
	t.Run("decisions", func(t *testing.T) {
		sum := m["pgtraffic.decisions"].Data.(metricdata.Sum[int64])
		got := map[string]int64{}
		for _, dp := range sum.DataPoints {
			b, _ := dp.Attributes.Value("pgtraffic.budget")
			d, _ := dp.Attributes.Value("pgtraffic.decision")
			r, _ := dp.Attributes.Value("pgtraffic.reason")
			got[b.AsString()+"/"+d.AsString()+"/"+r.AsString()] += dp.Value
		}
		want := map[string]int64{
			"reporting/allow/":            1,
			"reporting/block/concurrency": 1,
			"require_where/block/guard":   1,
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("decisions[%s] = %d, want %d (all %v)", k, got[k], v, got)
			}
		}
	})
	t.Run("gauges", func(t *testing.T) {
		inFlight := map[string]int64{}
		for _, dp := range m["pgtraffic.budget.in_flight"].Data.(metricdata.Gauge[int64]).DataPoints {
			b, _ := dp.Attributes.Value("pgtraffic.budget")
			inFlight[b.AsString()] = dp.Value
		}
		if inFlight["reporting"] != 1 || inFlight["audit"] != 0 || len(inFlight) != 3 {
			t.Errorf("in_flight %v, want reporting=1 audit=0 costed=0", inFlight)
		}
		debt := m["pgtraffic.budget.debt"]
		if debt.Unit != "s" || len(debt.Data.(metricdata.Gauge[float64]).DataPoints) != 3 {
			t.Errorf("debt: unit %q, %d points, want s and 3", debt.Unit, len(debt.Data.(metricdata.Gauge[float64]).DataPoints))
		}
		counter := func(name string) int64 {
			t.Helper()
			mm, ok := m[name]
			if !ok {
				t.Errorf("no %s", name)
				return -1
			}
			s := mm.Data.(metricdata.Sum[int64])
			if !s.IsMonotonic || len(s.DataPoints) != 1 {
				t.Errorf("%s: monotonic %v, %d points", name, s.IsMonotonic, len(s.DataPoints))
				return -1
			}
			return s.DataPoints[0].Value
		}
		// Patterns: SELECT 1 FROM orders, the failing UPDATE, the held SELECT and the DELETE.
		if got := counter("pgtraffic.pattern_cache.misses"); got != 4 {
			t.Errorf("pattern misses %d, want 4", got)
		}
		if got := counter("pgtraffic.pattern_cache.hits"); got != 2 {
			t.Errorf("pattern hits %d, want 2", got)
		}
		if got := counter("pgtraffic.rules.reloads"); got != 1 {
			t.Errorf("reloads %d, want 1", got)
		}
		for _, name := range []string{"pgtraffic.rules.reload_failures", "pgtraffic.explain.calls",
			"pgtraffic.explain.failures", "pgtraffic.explain.cache_hits", "pgtraffic.explain.cache_misses"} {
			if got := counter(name); got != 0 {
				t.Errorf("%s = %d, want 0", name, got)
			}
		}
	})
}

func TestGaugesStopAfterClose(t *testing.T) {
	h := newTelHarness(t, telRules)
	if _, ok := h.metrics(t)["pgtraffic.budget.debt"]; !ok {
		t.Fatal("no pgtraffic.budget.debt before close")
	}
	// Attaching twice keeps one callback: a scrape must not see each budget twice.
	if err := h.tel.attach(h.rt); err != nil {
		t.Fatal(err)
	}
	if n := len(h.metrics(t)["pgtraffic.budget.debt"].Data.(metricdata.Gauge[float64]).DataPoints); n != 3 {
		t.Fatalf("after a second attach: %d debt points, want 3", n)
	}
	if err := h.tel.close(); err != nil {
		t.Fatal(err)
	}
	if err := h.tel.close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if m, ok := h.metrics(t)["pgtraffic.budget.debt"]; ok && len(m.Data.(metricdata.Gauge[float64]).DataPoints) > 0 {
		t.Fatalf("pgtraffic.budget.debt still reported after close: %+v", m)
	}
}

func TestDecisionLogRateLimited(t *testing.T) {
	h := newTelHarness(t, telRules)
	audit := tagging.With(context.Background(), "app", "audit")
	release := h.hold(t, audit)
	defer release()
	warn := func() {
		t.Helper()
		if _, err := h.db.ExecContext(audit, "SELECT 1 FROM orders WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
	}
	for range 5 {
		warn()
	}
	lines := func() []string {
		var out []string
		for _, l := range strings.Split(h.log.String(), "\n") {
			if strings.Contains(l, "budget=audit") {
				out = append(out, l)
			}
		}
		return out
	}
	if got := lines(); len(got) != 1 || strings.Contains(got[0], "suppressed") {
		t.Fatalf("5 warns in one second: log lines %q, want one without a suppressed count", got)
	}
	h.clock.Advance(999 * time.Millisecond)
	warn()
	if got := lines(); len(got) != 1 {
		t.Fatalf("a warn 999ms later was logged: %q", got)
	}
	h.clock.Advance(time.Millisecond)
	warn()
	got := lines()
	if len(got) != 2 {
		t.Fatalf("a warn 1s later: %d log lines, want 2: %q", len(got), got)
	}
	for _, want := range []string{"level=WARN", "decision=warn", "reason=concurrency", "suppressed=5", "fingerprint="} {
		if !strings.Contains(got[1], want) {
			t.Errorf("second line %q lacks %q", got[1], want)
		}
	}
	// Blocks are limited separately from warns, per budget.
	reporting := tagging.With(context.Background(), "app", "reporting")
	releaseR := h.hold(t, reporting)
	defer releaseR()
	for range 3 {
		if _, err := h.db.ExecContext(reporting, "SELECT 1 FROM orders"); !errors.Is(err, ErrBlocked) {
			t.Fatalf("want a block, got %v", err)
		}
	}
	if n := strings.Count(h.log.String(), "budget=reporting decision=block"); n != 1 {
		t.Fatalf("3 blocks in one second: %d log lines, want 1\n%s", n, h.log.String())
	}
}

// TestNoSecretsInTelemetry runs statements with secret literals and bound values through every
// path (allow, warn, block, guard, server error, prepared statement, unparsable text, commenter
// on) and checks that no secret appears in any span name, attribute, event, status, log line,
// metric attribute or in the comment the commenter appends.
func TestNoSecretsInTelemetry(t *testing.T) {
	const literal, bound = "hunter2literal", "boundsecret7781"
	h := newTelHarness(t, telRules, WithSQLCommenter(true))
	ctx := context.Background()
	audit := tagging.With(ctx, "app", "audit")
	reporting := tagging.With(ctx, "app", "reporting")
	costed := tagging.With(ctx, "app", "costed", "tenant", "t1")
	releaseA := h.hold(t, audit)
	releaseR := h.hold(t, reporting)

	q := "SELECT id FROM orders WHERE note = '" + literal + "' AND id = $1"
	run := []struct {
		ctx  context.Context
		sql  string
		args []any
	}{
		{ctx, q, []any{bound}},
		{audit, q, []any{bound}},                                 // warn
		{reporting, q, []any{bound}},                             // block
		{costed, q, []any{bound}},                                // costed
		{ctx, "UPDATE orders SET note = '" + literal + "'", nil}, // guard block
		{ctx, "UPDATE orders SET fail_here = '" + literal + "' WHERE id = $1", []any{bound}}, // server error quoting the bound value
		{ctx, "SELEC '" + literal + "' $1", []any{bound}},                                    // unparsable
	}
	for _, r := range run {
		rows, err := h.db.QueryContext(r.ctx, r.sql, r.args...)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
		}
	}
	st, err := h.db.PrepareContext(audit, q)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ExecContext(audit, bound); err != nil {
		t.Fatal(err)
	}
	st.Close()
	releaseA()
	releaseR()

	var texts []string
	for _, s := range h.spans.GetSpans() {
		texts = append(texts, s.Name, s.Status.Description)
		for _, kv := range s.Attributes {
			texts = append(texts, string(kv.Key)+"="+kv.Value.String())
		}
		for _, e := range s.Events {
			texts = append(texts, e.Name)
			for _, kv := range e.Attributes {
				texts = append(texts, string(kv.Key)+"="+kv.Value.String())
			}
		}
	}
	if len(h.spans.GetSpans()) < len(run) {
		t.Fatalf("%d spans for %d statements", len(h.spans.GetSpans()), len(run))
	}
	for _, m := range h.metrics(t) {
		texts = append(texts, fmt.Sprintf("%s %+v", m.Name, m.Data))
	}
	texts = append(texts, h.log.String())
	if !strings.Contains(h.log.String(), "decision=block") || !strings.Contains(h.log.String(), "decision=warn") {
		t.Fatalf("expected warn and block log lines:\n%s", h.log.String())
	}
	for _, text := range texts {
		for _, secret := range []string{literal, bound} {
			if strings.Contains(text, secret) {
				t.Errorf("telemetry contains %q: %s", secret, text)
			}
		}
	}
	// What the server sees: the application's own text plus, when commented, tags and a
	// traceparent, never a bound value.
	for _, sent := range h.sent.all() {
		if strings.Contains(sent, bound) {
			t.Errorf("sent text contains the bound value: %s", sent)
		}
		comment := strings.TrimPrefix(sent, strings.SplitN(sent, "/*", 2)[0])
		if strings.Contains(comment, literal) {
			t.Errorf("appended comment contains the literal: %s", sent)
		}
	}
}

func TestSQLCommenter(t *testing.T) {
	tests := []struct {
		name        string
		on          bool
		sampler     sdktrace.Sampler
		query       string
		tags        []string
		want        string // regular expression-free: the exact text sent, with TRACE for the traceparent
		traceparent bool
	}{
		{name: "off", on: false, sampler: sdktrace.AlwaysSample(), query: "SELECT 1 FROM t", tags: []string{"app", "web"},
			want: "SELECT 1 FROM t"},
		{name: "tags and traceparent", on: true, sampler: sdktrace.AlwaysSample(), query: "SELECT 1 FROM t;", tags: []string{"app", "web", "route", "/a b"},
			want: "SELECT 1 FROM t /*app='web',route='%2Fa%20b',traceparent='TRACE'*/;", traceparent: true},
		{name: "unsampled span: tags only", on: true, sampler: sdktrace.NeverSample(), query: "SELECT 1 FROM t", tags: []string{"app", "web"},
			want: "SELECT 1 FROM t /*app='web'*/"},
		{name: "nothing to add", on: true, sampler: sdktrace.NeverSample(), query: "SELECT 1 FROM t",
			want: "SELECT 1 FROM t"},
		{name: "existing comment kept", on: true, sampler: sdktrace.AlwaysSample(), query: "SELECT 1 FROM t /*app='x'*/", tags: []string{"app", "web"},
			want: "SELECT 1 FROM t /*app='x'*/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			exp := tracetest.NewInMemoryExporter()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(tt.sampler))
			h := newTelHarness(t, "", WithSQLCommenter(tt.on), WithTracerProvider(tp))
			ctx := tagging.With(context.Background(), tt.tags...)
			if _, err := h.db.ExecContext(ctx, tt.query, 42); err != nil {
				t.Fatal(err)
			}
			sent := h.sent.all()
			if len(sent) != 1 {
				t.Fatalf("sent %q", sent)
			}
			want := tt.want
			if tt.traceparent {
				spans := exp.GetSpans()
				if len(spans) != 1 {
					t.Fatalf("%d spans", len(spans))
				}
				sc := spans[0].SpanContext
				want = strings.Replace(want, "TRACE", "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01", 1)
			}
			if sent[0] != want {
				t.Fatalf("sent %q\nwant %q", sent[0], want)
			}
		})
	}
}

// BenchmarkTracingOverhead measures what tracing adds to one statement on the engine's fast
// path (no rule matches; pattern cache hit), calling the interceptor directly with a fake
// driver.Conn: noop is tracing off; never-sample is an SDK provider that samples nothing (what
// an application with tracing configured pays for an unsampled statement); always-sample
// records every span without exporting it. Metrics are off.
//
//	go test -run '^$' -bench TracingOverhead -benchmem ./driver
func BenchmarkTracingOverhead(b *testing.B) {
	for _, p := range telProviders() {
		b.Run(p.name, func(b *testing.B) {
			exec := newTelBench(b, p.tp)
			b.ReportAllocs()
			for b.Loop() {
				exec()
			}
		})
	}
}

// BenchmarkTracingOverheadPaired alternates batches of statements with tracing off (noop) and
// with a provider that samples nothing, and reports the fastest batch of each and their
// difference: on a shared, loaded machine the minimum of interleaved batches is far steadier
// than two separate benchmarks.
//
//	go test -run '^$' -bench TracingOverheadPaired ./driver
func BenchmarkTracingOverheadPaired(b *testing.B) {
	off := newTelBench(b, tracenoop.NewTracerProvider())
	never := newTelBench(b, sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))
	const batch = 200
	minOff, minNever := time.Duration(1<<62), time.Duration(1<<62)
	run := func(exec func()) time.Duration {
		t0 := time.Now()
		for range batch {
			exec()
		}
		return time.Since(t0)
	}
	b.ReportAllocs()
	for b.Loop() {
		minOff = min(minOff, run(off))
		minNever = min(minNever, run(never))
	}
	perOff := float64(minOff.Nanoseconds()) / batch
	perNever := float64(minNever.Nanoseconds()) / batch
	b.ReportMetric(perOff, "ns/stmt-off")
	b.ReportMetric(perNever, "ns/stmt-never-sample")
	b.ReportMetric(perNever-perOff, "ns/stmt-added")
	b.ReportMetric(perNever/perOff, "ratio")
}

func telProviders() []struct {
	name string
	tp   trace.TracerProvider
} {
	return []struct {
		name string
		tp   trace.TracerProvider
	}{
		{"noop", tracenoop.NewTracerProvider()},
		{"never-sample", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))},
		{"always-sample", sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))},
	}
}

// newTelBench returns a function that runs one statement through the interceptor with tracing
// from tp, metrics off and no rules.
func newTelBench(b *testing.B, tp trace.TracerProvider) func() {
	var o options
	o.tracerProvider = tp
	o.meterProvider = metricnoop.NewMeterProvider()
	cc, err := pgx.ParseConfig(telDSN)
	if err != nil {
		b.Fatal(err)
	}
	tel, err := newTelemetry(&o, cc)
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(engine.Options{Observer: tel.observer(), Logger: slog.New(slog.DiscardHandler)})
	c := &conn{parent: telDiscard{&telConn{}}, intr: &interceptor{engine: eng}}
	ctx := tagging.With(context.Background(), "app", "web")
	const q = "SELECT id FROM orders WHERE id = $1"
	args := []driver.NamedValue{{Ordinal: 1, Value: int64(1)}}
	return func() {
		if _, err := c.ExecContext(ctx, q, args); err != nil {
			b.Fatal(err)
		}
	}
}

// telDiscard is a connection whose Exec does nothing, so the benchmark measures pgtraffic.
type telDiscard struct{ *telConn }

func (telDiscard) ExecContext(context.Context, string, []driver.NamedValue) (driver.Result, error) {
	return driver.RowsAffected(1), nil
}

// TestSpanWhenWaitIsCancelled: a statement whose context ends while it waits for capacity
// (max_wait) was never sent; its budget kept it out until then: its span says both, and the
// decisions metric counts a block for what it waited for.
func TestSpanWhenWaitIsCancelled(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: waiting
    mode: enforce
    max_concurrent: 1
    max_wait: 1m
rules:
  - budget: waiting
    match: {app: waiting}
`)
	waiting := tagging.With(context.Background(), "app", "waiting")
	release := h.hold(t, waiting)
	defer release()
	ctx, cancel := context.WithCancel(waiting)
	cancel() // the engine finds the slot taken, then sees ctx end instead of waiting
	if _, err := h.eng.Begin(ctx, new(engine.Exec), nil, "SELECT 1 FROM orders", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Begin: %v, want context.Canceled", err)
	}
	s := h.span(t, "SELECT orders", "waiting")
	if s.Status.Code != codes.Error || !strings.Contains(s.Status.Description, "waiting for capacity") {
		t.Errorf("status %v %q", s.Status.Code, s.Status.Description)
	}
	if got := attrOf(s.Attributes, "error.type").AsString(); got != "context.Canceled" {
		t.Errorf("error.type %q", got)
	}
	if got := attrOf(s.Attributes, "pgtraffic.decision").AsString(); got != "block" {
		t.Errorf("decision %q, want block: the budget kept it out until its context ended", got)
	}
	if got := attrOf(s.Attributes, "pgtraffic.reason").AsString(); got != "concurrency" {
		t.Errorf("reason %q, want concurrency (what it waited for)", got)
	}
	blocks := int64(0)
	for _, dp := range h.metrics(t)["pgtraffic.decisions"].Data.(metricdata.Sum[int64]).DataPoints {
		if d, _ := dp.Attributes.Value("pgtraffic.decision"); d.AsString() == "block" {
			blocks += dp.Value
		}
	}
	if blocks != 1 {
		t.Errorf("%d blocks counted for the cancelled wait, want 1", blocks)
	}
}

// TestIdleGlobalProviderSkipsSpans: while the default global provider records nothing (here
// otel's no-op provider; an earlier test may have given the unset placeholder a delegate) no
// span is started; once the application installs one, spans start.
func TestIdleGlobalProviderSkipsSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	old := otel.GetTracerProvider()
	t.Cleanup(func() { otel.SetTracerProvider(old) })
	idle := tracenoop.NewTracerProvider()
	otel.SetTracerProvider(idle)
	tel, err := newTelemetry(&options{}, &pgx.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if tel.idleGlobal != idle {
		t.Fatal("the no-op global tracer provider was not recognised as recording nothing")
	}
	tel.tracer = tp.Tracer(instrumentationName)
	eng := engine.New(engine.Options{Observer: tel})
	x := new(engine.Exec)
	ctx, err := eng.Begin(context.Background(), x, nil, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if x.Observed || trace.SpanFromContext(ctx).SpanContext().IsValid() {
		t.Fatal("a span started while no global provider is installed")
	}
	x.Finish(ctx, nil)
	otel.SetTracerProvider(tp)
	waitWants(t, tel, engine.WantSpans)
	if ctx, err = eng.Begin(context.Background(), x, nil, "select 1", nil); err != nil {
		t.Fatal(err)
	}
	if !x.Observed || !trace.SpanFromContext(ctx).IsRecording() {
		t.Fatal("no span after otel.SetTracerProvider")
	}
	x.Finish(ctx, nil)
	if len(exp.GetSpans()) != 1 {
		t.Fatalf("exported %d spans", len(exp.GetSpans()))
	}
}

// waitWants waits until tel wants want, which it notices within wantsRefresh of a provider
// installed after it was made.
func waitWants(t *testing.T, tel *telemetry, want engine.Wants) {
	t.Helper()
	deadline := time.Now().Add(5 * wantsRefresh)
	for tel.Wants()&want == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Wants = %b, %v after the provider was installed; want %b", tel.Wants(), 5*wantsRefresh, want)
		}
		time.Sleep(wantsRefresh / 20)
	}
}

// TestWantsRefreshStopsAtClose: a closed telemetry asks the global providers no more.
func TestWantsRefreshStopsAtClose(t *testing.T) {
	tel, err := newTelemetry(&options{}, &pgx.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	tel.mu.Lock()
	refresh := tel.refresh
	tel.mu.Unlock()
	if refresh == nil {
		t.Fatal("no refresh of what the global providers want")
	}
	if err := tel.close(); err != nil {
		t.Fatal(err)
	}
	tel.refreshWants() // as a refresh already running when close stopped its timer
	if refresh.Stop() {
		t.Fatal("a refresh after close set the timer again")
	}
}

// idleMeterChild is set in the environment of the process TestIdleGlobalMeterProvider starts.
const idleMeterChild = "PGTRAFFIC_TEST_IDLE_METER_CHILD"

// TestIdleGlobalMeterProvider: while the global meter provider is otel's placeholder, Wants
// asks for no metric; once the application installs a provider, the duration metric and the
// decision counts are wanted, and recorded through the instruments made before.
func TestIdleGlobalMeterProvider(t *testing.T) {
	// otel's global meter provider cannot be put back to its placeholder once set, so the test
	// runs in a process of its own: again under go test -count=N, and whatever ran before it.
	if os.Getenv(idleMeterChild) == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestIdleGlobalMeterProvider$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), idleMeterChild+"=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS: TestIdleGlobalMeterProvider")) {
			t.Fatalf("the test in a process of its own: %v\n%s", err, out)
		}
		return
	}
	probe, err := otel.GetMeterProvider().Meter("probe").Int64Counter("probe")
	if err != nil || probe.Enabled(context.Background()) {
		t.Fatalf("the global meter provider records (%v): a test installed one before", err)
	}
	tel, err := newTelemetry(&options{}, &pgx.ConnConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if tel.idleMeter == nil {
		t.Fatal("the placeholder global meter provider was not recognised")
	}
	if w := tel.Wants(); w&(engine.WantDuration|engine.WantDecisions) != 0 {
		t.Fatalf("Wants = %b with no meter provider installed", w)
	}
	// The global cannot be reset to the placeholder; later tests use their own providers.
	reader := sdkmetric.NewManualReader()
	otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	waitWants(t, tel, engine.WantDuration)
	if w := tel.Wants(); w&engine.WantDuration == 0 || w&engine.WantDecisions == 0 {
		t.Fatalf("Wants = %b after otel.SetMeterProvider, want the duration and the decisions", w)
	}
	tel.Decision("orders", engine.DecisionAllow, "")
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "pgtraffic.decisions" {
				for _, dp := range sum.DataPoints {
					found = found || dp.Value == 1
				}
			}
		}
	}
	if !found {
		t.Fatalf("no pgtraffic.decisions count of 1 after one decision: %+v", rm)
	}
}

// TestTagKeys: a tag's span attribute key is pgtraffic.tag.<key> for built-in and other keys,
// before and after the cache's bound, and a known key costs no allocation.
func TestTagKeys(t *testing.T) {
	var tm telemetry
	for _, k := range []string{vocab.KeyUsername, vocab.KeyDatabase, vocab.KeyApplicationName, vocab.KeyStatement, vocab.KeyTable, "route", "app"} {
		for range 2 { // built, then cached
			if got := tm.tagKey(k); string(got) != "pgtraffic.tag."+k {
				t.Fatalf("tagKey(%q) = %q", k, got)
			}
		}
	}
	if n := testing.AllocsPerRun(100, func() { tm.tagKey("route"); tm.tagKey(vocab.KeyTable) }); n != 0 {
		t.Errorf("tagKey of known keys: %v allocations, want 0", n)
	}
	for i := range 2 * maxTagKeys {
		k := fmt.Sprintf("k%d", i)
		if got := tm.tagKey(k); string(got) != "pgtraffic.tag."+k {
			t.Fatalf("tagKey(%q) = %q", k, got)
		}
	}
	if n := len(*tm.tagKeys.Load()); n != maxTagKeys {
		t.Errorf("cache holds %d keys, want the bound %d", n, maxTagKeys)
	}
	if got := tm.tagKey("k1"); got != "pgtraffic.tag.k1" {
		t.Errorf("tagKey(k1) = %q after the bound", got)
	}
}

// Tags are untrusted: a comment, a request path. Every span attribute and metric attribute must
// be valid UTF-8 (OTLP's protobuf refuses to marshal anything else, and an exporter then drops
// the whole batch) and each tag bounded in length, whatever the comment, the route or the
// statement's identifiers hold.
func TestTelemetryAttributesBoundedUTF8(t *testing.T) {
	h := newTelHarness(t, telRules)
	long := strings.Repeat("x", 10<<10)
	run := func(ctx context.Context, query string) {
		t.Helper()
		rows, err := h.db.QueryContext(ctx, query)
		if err != nil {
			t.Fatalf("%.60q: %v", query, err)
		}
		for rows.Next() {
		}
		rows.Close()
	}
	ctx := context.Background()
	run(ctx, "SELECT id FROM orders /*app='comment',note='"+long+"'*/")
	run(ctx, "SELECT id FROM orders /*app='badcomment',bad='%FF%FE',k%FF='v'*/")
	run(tagging.With(ctx, "app", "context", "note", long, strings.Repeat("k", 1000), "v",
		"k\xff", "v\xfe\xff"), "SELECT id FROM orders")
	run(ctx, "SELECT \"caf\xff\" FROM \"t\xfe\" /*app='ident'*/")
	for _, target := range []string{"/%FF%FE", "/" + strings.Repeat("r", 8<<10)} {
		r := httptest.NewRequest("GET", target, nil)
		tagging.Middleware(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			run(tagging.With(r.Context(), "app", "route"), "SELECT id FROM orders")
		})).ServeHTTP(httptest.NewRecorder(), r)
	}

	check := func(where string, kv attribute.KeyValue) {
		t.Helper()
		k := string(kv.Key)
		var vals []string
		switch kv.Value.Type() {
		case attribute.STRING:
			vals = []string{kv.Value.AsString()}
		case attribute.STRINGSLICE:
			vals = kv.Value.AsStringSlice()
		}
		if !utf8.ValidString(k) {
			t.Errorf("%s: attribute key %q is not UTF-8", where, k)
		}
		for _, v := range vals {
			if !utf8.ValidString(v) {
				t.Errorf("%s: attribute %s = %q is not UTF-8", where, k, v)
			}
		}
		if tag, ok := strings.CutPrefix(k, attrTagPrefix); ok {
			if len(tag) > bounded.KeyLen {
				t.Errorf("%s: tag key of %d bytes", where, len(tag))
			}
			for _, v := range vals {
				if len(v) > bounded.ValueLen {
					t.Errorf("%s: tag %.20s... value of %d bytes", where, tag, len(v))
				}
			}
		}
	}
	spans := h.spans.GetSpans()
	apps := map[string]bool{}
	for _, s := range spans {
		if !utf8.ValidString(s.Name) {
			t.Errorf("span name %q is not UTF-8", s.Name)
		}
		for _, kv := range s.Attributes {
			check("span "+s.Name, kv)
		}
		for _, e := range s.Events {
			for _, kv := range e.Attributes {
				check("event "+e.Name, kv)
			}
		}
		apps[attrOf(s.Attributes, "pgtraffic.tag.app").AsString()] = true
	}
	for _, app := range []string{"comment", "badcomment", "context", "ident", "route"} {
		if !apps[app] {
			t.Errorf("no span with app=%s (spans: %v)", app, spanNames(spans))
		}
	}
	// What was kept is there, cut or with its invalid bytes replaced.
	if got := attrOf(h.span(t, "SELECT orders", "context").Attributes, "pgtraffic.tag.note").AsString(); got != long[:bounded.ValueLen] {
		t.Errorf("context tag note: %d bytes, want %d", len(got), bounded.ValueLen)
	}
	if got := attrOf(h.span(t, "SELECT orders", "context").Attributes, "pgtraffic.tag.k\uFFFD").AsString(); got != "v\uFFFD" {
		t.Errorf("context tag with invalid UTF-8: %q, want %q", got, "v\uFFFD")
	}
	var routes []string
	for _, s := range spans {
		if attrOf(s.Attributes, "pgtraffic.tag.app").AsString() == "route" {
			routes = append(routes, attrOf(s.Attributes, "pgtraffic.tag.route").AsString())
		}
	}
	if want := []string{"/\uFFFD", "/" + strings.Repeat("r", bounded.ValueLen-1)}; !slices.Equal(routes, want) {
		t.Errorf("routes %.80q, want %.80q", routes, want)
	}
	for name, m := range h.metrics(t) {
		switch d := m.Data.(type) {
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				for _, kv := range p.Attributes.ToSlice() {
					check("metric "+name, kv)
				}
			}
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				for _, kv := range p.Attributes.ToSlice() {
					check("metric "+name, kv)
				}
			}
		}
	}
}

// recordingMeter records the names of the instruments made on it; they do nothing else.
type recordingMeter struct {
	metricnoop.Meter
	mu    sync.Mutex // protects names
	names []string
}

func (m *recordingMeter) add(name string) {
	m.mu.Lock()
	m.names = append(m.names, name)
	m.mu.Unlock()
}

func (m *recordingMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	m.add(name)
	return m.Meter.Int64Counter(name, opts...)
}

func (m *recordingMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	m.add(name)
	return m.Meter.Float64Histogram(name, opts...)
}

func (m *recordingMeter) Int64ObservableCounter(name string, opts ...metric.Int64ObservableCounterOption) (metric.Int64ObservableCounter, error) {
	m.add(name)
	return m.Meter.Int64ObservableCounter(name, opts...)
}

func (m *recordingMeter) Int64ObservableGauge(name string, opts ...metric.Int64ObservableGaugeOption) (metric.Int64ObservableGauge, error) {
	m.add(name)
	return m.Meter.Int64ObservableGauge(name, opts...)
}

func (m *recordingMeter) Float64ObservableGauge(name string, opts ...metric.Float64ObservableGaugeOption) (metric.Float64ObservableGauge, error) {
	m.add(name)
	return m.Meter.Float64ObservableGauge(name, opts...)
}

type recordingMeterProvider struct {
	metricnoop.MeterProvider
	m *recordingMeter
}

func (p recordingMeterProvider) Meter(string, ...metric.MeterOption) metric.Meter { return p.m }

// TestTelemetryNames holds the names of the README's telemetry reference to
// the code: every metric is registered under its name, no other is, and each attribute key is
// spelled as documented.
func TestTelemetryNames(t *testing.T) {
	metrics := []string{
		"db.client.operation.duration",
		"pgtraffic.decisions",
		"pgtraffic.budget.debt", "pgtraffic.budget.in_flight",
		"pgtraffic.pattern_cache.hits", "pgtraffic.pattern_cache.misses",
		"pgtraffic.explain.cache_hits", "pgtraffic.explain.cache_misses",
		"pgtraffic.explain.calls", "pgtraffic.explain.failures",
		"pgtraffic.rules.reloads", "pgtraffic.rules.reload_failures",
		"pgtraffic.probes",
		"pgtraffic.health.errors", "pgtraffic.health.samples",
		"pgtraffic.health.shared_samples", "pgtraffic.health.elections",
		"pgtraffic.server_clock.reads", "pgtraffic.server_clock.failures",
		"pgtraffic.server_clock.resets", "pgtraffic.server_clock.rejected",
		"pgtraffic.server_clock.shared_reads",
		"pgtraffic.rows.leaked",
		"pgtraffic.coordination.lease.rate", "pgtraffic.coordination.lease.burst",
		"pgtraffic.coordination.global_debt", "pgtraffic.coordination.sync.latency",
		"pgtraffic.coordination.lease.slots", "pgtraffic.coordination.instances",
		"pgtraffic.coordination.fallback",
		"pgtraffic.coordination.syncs", "pgtraffic.coordination.sync.failures",
	}
	m := &recordingMeter{}
	var o options
	WithMeterProvider(recordingMeterProvider{m: m})(&o)
	WithTracerProvider(tracenoop.NewTracerProvider())(&o)
	cc, err := pgx.ParseConfig(telDSN)
	if err != nil {
		t.Fatal(err)
	}
	tel, err := newTelemetry(&o, cc)
	if err != nil {
		t.Fatal(err)
	}
	if err := tel.attach(runtime.New(engine.New(engine.Options{Observer: tel.observer()}), runtime.Options{})); err != nil {
		t.Fatal(err)
	}
	defer tel.close()
	if _, err := newLeaks(tel.meter, nil); err != nil {
		t.Fatal(err)
	}
	got := slices.Sorted(slices.Values(m.names))
	want := slices.Sorted(slices.Values(metrics))
	if !slices.Equal(got, want) {
		t.Errorf("registered metrics:\n%q\nthe documented ones:\n%q", got, want)
	}

	attrs := map[string]string{
		"db.system.name": attrSystem, "db.namespace": attrNamespace,
		"server.address": attrServerAddress, "server.port": attrServerPort,
		"db.query.text": attrQueryText, "db.query.summary": attrQuerySummary,
		"db.operation.name": attrOperation, "db.collection.name": attrCollection,
		"db.response.status_code": attrStatusCode, "error.type": attrErrorType,
		"pgtraffic.fingerprint": attrFingerprint, "pgtraffic.decision": attrDecision,
		"pgtraffic.budgets": attrBudgets, "pgtraffic.budget": attrBudget, "pgtraffic.reason": attrReason,
		"pgtraffic.predicted_cost_s": attrPredicted, "pgtraffic.plan_cost": attrPlanCost,
		"pgtraffic.tag.": attrTagPrefix, "pgtraffic.warn": eventWarn, "pgtraffic.connector": attrConnector,
		"db.operation.batch.size": attrBatchSize,
	}
	for doc, code := range attrs {
		if doc != code {
			t.Errorf("attribute %q is %q in the code", doc, code)
		}
	}
}
