package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	"github.com/pgtraffic/pgtraffic/tagging"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

const instrumentationName = "github.com/pgtraffic/pgtraffic"

// dbSystem is db.system.name, and the name of a span whose statement could not be parsed.
const dbSystem = "postgresql"

// The names of pgtraffic's telemetry, each defined here once and listed in the README's
// telemetry reference (TestTelemetryNames holds the two together). The db.*, server.* and
// error.type keys are the OpenTelemetry database semantic conventions.
const (
	attrSystem        = "db.system.name"
	attrNamespace     = "db.namespace"
	attrServerAddress = "server.address"
	attrServerPort    = "server.port"
	attrQueryText     = "db.query.text"
	attrQuerySummary  = "db.query.summary"
	attrOperation     = "db.operation.name"
	attrCollection    = "db.collection.name"
	attrStatusCode    = "db.response.status_code"
	attrErrorType     = "error.type"
	attrBatchSize     = "db.operation.batch.size"

	batchOperation = "BATCH" // db.operation.name of a batch of several statements

	attrFingerprint = "pgtraffic.fingerprint"
	attrDecision    = "pgtraffic.decision"
	attrBudgets     = "pgtraffic.budgets"
	attrBudget      = "pgtraffic.budget"
	attrReason      = "pgtraffic.reason"
	attrPredicted   = "pgtraffic.predicted_cost_s"
	attrPlanCost    = "pgtraffic.plan_cost"
	attrTagPrefix   = "pgtraffic.tag."
	attrConnector   = "pgtraffic.connector"

	eventWarn = "pgtraffic.warn" // on a warned statement's span
)

// Metric names.
const (
	metricDuration        = "db.client.operation.duration"
	metricDecisions       = "pgtraffic.decisions"
	metricBudgetDebt      = "pgtraffic.budget.debt"
	metricBudgetInFlight  = "pgtraffic.budget.in_flight"
	metricPatternHits     = "pgtraffic.pattern_cache.hits"
	metricPatternMisses   = "pgtraffic.pattern_cache.misses"
	metricExplainCalls    = "pgtraffic.explain.calls"
	metricExplainFailures = "pgtraffic.explain.failures"
	metricExplainHits     = "pgtraffic.explain.cache_hits"
	metricExplainMisses   = "pgtraffic.explain.cache_misses"
	metricReloads         = "pgtraffic.rules.reloads"
	metricReloadFailures  = "pgtraffic.rules.reload_failures"
	metricProbes          = "pgtraffic.probes"
	metricHealthErrors    = "pgtraffic.health.errors"
	metricHealthSamples   = "pgtraffic.health.samples"
	metricHealthShared    = "pgtraffic.health.shared_samples"
	metricHealthElections = "pgtraffic.health.elections"
	metricClockReads      = "pgtraffic.server_clock.reads"
	metricClockFailures   = "pgtraffic.server_clock.failures"
	metricClockResets     = "pgtraffic.server_clock.resets"
	metricClockRejected   = "pgtraffic.server_clock.rejected"
	metricClockShared     = "pgtraffic.server_clock.shared_reads"
	metricRowsLeaked      = "pgtraffic.rows.leaked"

	metricLeaseRate    = "pgtraffic.coordination.lease.rate"
	metricLeaseBurst   = "pgtraffic.coordination.lease.burst"
	metricLeaseSlots   = "pgtraffic.coordination.lease.slots"
	metricGlobalDebt   = "pgtraffic.coordination.global_debt"
	metricInstances    = "pgtraffic.coordination.instances"
	metricFallback     = "pgtraffic.coordination.fallback"
	metricSyncLatency  = "pgtraffic.coordination.sync.latency"
	metricSyncs        = "pgtraffic.coordination.syncs"
	metricSyncFailures = "pgtraffic.coordination.sync.failures"
)

// durationBuckets are db.client.operation.duration's bucket boundaries in seconds, the ones the
// semantic conventions recommend.
var durationBuckets = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10}

// telemetry turns the engine's decisions into OpenTelemetry spans and metrics following the
// database semantic conventions. It is the engine's Observer.
//
// Span attributes are computed only for recording spans and metric attributes only for enabled
// instruments, so a provider that samples nothing costs one non-recording span per statement.
// The engine's gauges (debt, in-flight, cache and EXPLAIN counters) are observed by a callback
// registered by attach and unregistered by close. Safe for concurrent use once built.
//
// A front end uses it through these calls only, so that another (a pgx pool) gets the same
// spans and metrics by making the same ones: newTelemetry with its options and connection
// config; observer as its engine's Options.Observer; attach once the engine exists; meter for
// its own instruments (newLeaks); commented for the text it sends; close when it closes.
type telemetry struct {
	tracer trace.Tracer
	// idleGlobal is the global tracer provider when it was used by default and recorded
	// nothing: a probe span was a no-op (no span context, not recording), as with otel's unset
	// placeholder. While otel.GetTracerProvider() returns it, startSpan skips tracer.Start. Once
	// the application calls otel.SetTracerProvider, spans start as usual.
	idleGlobal trace.TracerProvider
	// idleMeter is likewise the global meter provider when it was used by default and its
	// instruments were disabled, so that Wants asks one question of the global until
	// otel.SetMeterProvider instead of one per instrument.
	idleMeter  metric.MeterProvider
	meter      metric.Meter
	duration   metric.Float64Histogram
	decisions  metric.Int64Counter
	commonAttr []attribute.KeyValue // span attributes shared by every statement
	metricAttr []attribute.KeyValue // duration attributes shared by every statement
	// observedAttr are the attributes of every observation of the gauges' callback: the
	// server's and pgtraffic.connector, the connector's number in its process (1, 2, ... in
	// the order they were made), so that two connectors on one meter provider (a primary and a
	// replica, a database/sql connector beside a Pool) each report their budgets: observations
	// of two callbacks with the same attributes would be duplicates, of which the SDK keeps one.
	observedAttr []attribute.KeyValue
	// connectorAttr is observedAttr as the first option of every count of pgtraffic.decisions,
	// so that two connectors' decisions (a shard's and another's, a primary's and a replica's)
	// count apart, as their gauges do.
	connectorAttr metric.MeasurementOption

	// tagKeys maps the keys of tags other than the built-ins to their span attribute keys
	// (pgtraffic.tag.<key>), so that a span does not build them by concatenation, one
	// allocation per tag. Copied on write, at most maxTagKeys entries (an application's tag
	// keys are few; past the bound keys are built per span).
	tagKeys  atomic.Pointer[map[string]attribute.Key]
	attrBufs sync.Pool // *[]attribute.KeyValue: a span's attributes, copied by SetAttributes

	// wants is what Wants answers (an engine.Wants): evaluateWants reads the instruments and,
	// unless options named the providers, OpenTelemetry's globals, which a statement does not
	// do; refresh evaluates it again every wantsRefresh while one of them is a global, so that
	// a provider the application installs later is used from then on.
	wants atomic.Uint32

	mu      sync.Mutex // protects the fields below, and serialises tagKeys' writers
	reg     metric.Registration
	refresh *time.Timer // re-evaluates wants (refreshWants); nil when nothing may change it
	closed  bool
}

// wantsRefresh is how often a telemetry that reads OpenTelemetry's global providers asks them
// again what to record: a provider installed after the Connector or Pool was made records the
// statements that begin at most this long after it.
const wantsRefresh = time.Second

func newTelemetry(o *options, cc *pgx.ConnConfig) (*telemetry, error) {
	tp := o.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	mp := o.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{
		tracer: tp.Tracer(instrumentationName),
		meter:  mp.Meter(instrumentationName),
	}
	if o.tracerProvider == nil {
		// Decided through otel's public API: a tracer that records nothing hands back the
		// parent's span context unchanged, where any recording tracer starts a span of its own.
		// The parent is not sampled, so sampling follows it; and the probe is never ended, so
		// even a sampler that records everything exports nothing.
		parent := trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, Remote: true})
		_, probe := t.tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "pgtraffic.probe")
		if probe.SpanContext().Equal(parent) && !probe.IsRecording() {
			t.idleGlobal = tp
		}
	}
	var err error
	t.duration, err = t.meter.Float64Histogram(metricDuration,
		metric.WithUnit("s"),
		metric.WithDescription("Duration of database client operations."),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err != nil {
		return nil, telemetryError(err)
	}
	t.decisions, err = t.meter.Int64Counter(metricDecisions,
		metric.WithUnit("{decision}"),
		metric.WithDescription("Traffic-control decisions per budget: allow, warn or block."))
	if err != nil {
		return nil, telemetryError(err)
	}
	if ctx := context.Background(); o.meterProvider == nil && !t.duration.Enabled(ctx) && !t.decisions.Enabled(ctx) {
		t.idleMeter = mp
	}
	server := []attribute.KeyValue{ // from the DSN: valid UTF-8 as every attribute (a LATIN1 database's name)
		attribute.String(attrSystem, dbSystem),
		attribute.String(attrNamespace, bounded.Valid(databaseOf(cc))),
		attribute.String(attrServerAddress, bounded.Valid(cc.Host)),
		attribute.Int(attrServerPort, int(cc.Port)),
	}
	t.commonAttr = server
	t.metricAttr = server
	t.observedAttr = append(slices.Clip(server), attribute.Int64(attrConnector, int64(connectors.Add(1))))
	t.connectorAttr = metric.WithAttributeSet(attribute.NewSet(t.observedAttr...))
	t.wants.Store(uint32(t.evaluateWants()))
	if o.tracerProvider == nil || o.meterProvider == nil {
		t.mu.Lock() // the timer's first call may come before AfterFunc returns
		t.refresh = time.AfterFunc(wantsRefresh, t.refreshWants)
		t.mu.Unlock()
	}
	return t, nil
}

// refreshWants evaluates wants again, and again after wantsRefresh until close.
func (t *telemetry) refreshWants() {
	t.wants.Store(uint32(t.evaluateWants())) // the SDK's code: not under t.mu
	t.mu.Lock()
	if !t.closed {
		t.refresh.Reset(wantsRefresh)
	}
	t.mu.Unlock()
}

// connectors numbers the connectors and pools of the process (telemetry.observedAttr).
var connectors atomic.Uint64

func telemetryError(err error) error { return fmt.Errorf("pgtraffic: telemetry: %w", err) }

func (t *telemetry) observer() engine.Observer { return t }

// attach registers the callback that observes the gauges and counters of rt and its engine,
// once per connector. It reads only atomics and the budgets' snapshots (O(keys) per budget
// under each budget's lock: fine at scrape rate).
func (t *telemetry) attach(rt *runtime.Runtime) error {
	e := rt.Engine()
	ob := &observables{m: t.meter}
	fg, ig, ic := ob.floatGauge, ob.intGauge, ob.counter
	debt := fg(metricBudgetDebt, "s", "Execution seconds owed by the budget's buckets, summed over keys.")
	inFlight := ig(metricBudgetInFlight, "{statement}", "Statements of the budget in flight.")
	patternHits := ic(metricPatternHits, "{lookup}", "Pattern cache hits.")
	patternMisses := ic(metricPatternMisses, "{lookup}", "Pattern cache misses (statements parsed).")
	explainCalls := ic(metricExplainCalls, "{call}", "EXPLAIN round trips made to predict a cost.")
	explainFailures := ic(metricExplainFailures, "{call}", "EXPLAIN calls that failed (cost fell back to history).")
	explainHits := ic(metricExplainHits, "{lookup}", "Planner costs served from the EXPLAIN cache.")
	explainMisses := ic(metricExplainMisses, "{lookup}", "EXPLAIN cache misses.")
	reloads := ic(metricReloads, "{reload}", "Rule sets put in force, the first included.")
	reloadFailures := ic(metricReloadFailures, "{reload}", "Rules-file changes rejected; the last good rules stayed.")
	probes := ic(metricProbes, "{statement}", "Statements run as a probe of a pattern refused as costing more than a limit.")
	healthErrors := ic(metricHealthErrors, "{error}", "Failed health reads and connects.")
	healthSamples := ic(metricHealthSamples, "{sample}", "Successful health metric reads.")
	healthShared := ic(metricHealthShared, "{sample}", "Health readings taken from the sampler elected for the database, through Redis.")
	healthElections := ic(metricHealthElections, "{election}", "Times this instance became or stopped being the health sampler elected for its database.")
	clockReads := ic(metricClockReads, "{read}", "Reads of pg_stat_statements that succeeded (the server's clock).")
	clockFailures := ic(metricClockFailures, "{error}", "Failed server clock connects, round trips and reads of pg_stat_statements (costs stay on the client's clock).")
	clockResets := ic(metricClockResets, "{event}", "Query counters found reset, evicted or gone in pg_stat_statements: that read taught nothing of them.")
	clockRejected := ic(metricClockRejected, "{row}", "pg_stat_statements rows, and shared readings, rejected as nonsense.")
	clockShared := ic(metricClockShared, "{read}", "Server clock readings taken from the reader elected for the database, through Redis.")
	coordInst, coordObs := newCoordInstruments(ob)
	if err := errors.Join(ob.errs...); err != nil {
		return telemetryError(err)
	}
	observe := func(_ context.Context, o metric.Observer) error {
		coordInst.observe(o, rt, t.perBudget)
		for _, b := range e.Budgets() {
			attrs := t.perBudget(b.Name)
			o.ObserveFloat64(debt, b.Debt, attrs)
			o.ObserveInt64(inFlight, int64(b.InFlight), attrs)
		}
		attrs := metric.WithAttributes(t.observedAttr...)
		count := func(c metric.Int64ObservableCounter, n uint64) { o.ObserveInt64(c, clampInt64(n), attrs) }
		hits, misses, _ := e.PatternStats()
		count(patternHits, hits)
		count(patternMisses, misses)
		st := e.Stats()
		count(explainCalls, st.ExplainCalls.Load())
		count(explainFailures, st.ExplainFailures.Load())
		count(explainHits, st.ExplainCacheHits.Load())
		count(explainMisses, st.ExplainCacheMisses.Load())
		count(reloads, st.Reloads.Load())
		count(reloadFailures, st.ReloadFailures.Load())
		count(probes, st.Probes.Load())
		if h, ok := rt.Health(); ok {
			count(healthErrors, h.Errors)
			count(healthSamples, h.Samples)
			count(healthShared, h.Shared)
			count(healthElections, h.Elections)
		}
		if c, ok := rt.ServerClock(); ok {
			count(clockReads, c.Reads)
			count(clockFailures, c.Failures)
			count(clockResets, c.Resets)
			count(clockRejected, c.Rejected)
			count(clockShared, c.Shared)
		}
		return nil
	}
	reg, err := t.meter.RegisterCallback(observe, append(coordObs, debt, inFlight, patternHits, patternMisses, explainCalls,
		explainFailures, explainHits, explainMisses, reloads, reloadFailures, probes, healthErrors, healthSamples,
		healthShared, healthElections, clockReads, clockFailures, clockResets, clockRejected, clockShared)...)
	if err != nil {
		return telemetryError(err)
	}
	t.mu.Lock()
	old := t.reg
	t.reg = reg
	t.mu.Unlock()
	if old != nil { // attach twice: keep one callback, so a scrape does not count twice
		return old.Unregister()
	}
	return nil
}

// close unregisters the gauges' callback, so that a closed connector's engine is neither kept
// alive by the meter provider nor reported. It is idempotent.
func (t *telemetry) close() error {
	t.mu.Lock()
	reg := t.reg
	t.reg = nil
	t.closed = true
	if t.refresh != nil {
		t.refresh.Stop()
	}
	t.mu.Unlock()
	if reg == nil {
		return nil
	}
	if err := reg.Unregister(); err != nil {
		return telemetryError(err)
	}
	return nil
}

func clampInt64(n uint64) int64 { return int64(min(n, 1<<63-1)) }

// perBudget is the attributes of an observation of budget's: the connector's and
// pgtraffic.budget.
func (t *telemetry) perBudget(budget string) metric.MeasurementOption {
	return metric.WithAttributes(append(slices.Clip(t.observedAttr), attribute.String(attrBudget, budget))...)
}

// spanName is db.query.summary (e.g. "SELECT orders"), or db.system.name when the statement
// could not be parsed, as the semantic conventions say.
func spanName(x *engine.Exec) string {
	if x.Pattern.Summary != "" {
		return x.Pattern.Summary
	}
	return dbSystem
}

// clientKind is the span kind of every statement span, boxed once.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// idleSpan is a no-op, non-recording span (never the caller's: we end the spans we start).
var idleSpan = trace.SpanFromContext(context.Background())

// Wants is what evaluateWants last answered (wants). The engine keeps the answer in Exec.Wants
// and Exec.Observed, so the methods below do not ask again.
func (t *telemetry) Wants() engine.Wants { return engine.Wants(t.wants.Load()) }

// evaluateWants: spans unless the tracer is the idle global provider's (which records nothing
// until the application installs one); the duration metric and decision counts when their
// instruments are enabled.
func (t *telemetry) evaluateWants() engine.Wants {
	var w engine.Wants
	if t.idleGlobal == nil || otel.GetTracerProvider() != t.idleGlobal {
		w |= engine.WantSpans
	}
	if t.idleMeter != nil && otel.GetMeterProvider() == t.idleMeter {
		return w
	}
	ctx := context.Background()
	if t.duration.Enabled(ctx) {
		w |= engine.WantDuration
	}
	if t.decisions.Enabled(ctx) {
		w |= engine.WantDecisions
	}
	return w
}

// startSpan starts a statement's span. When the statement matched a budget, or was refused, the
// span starts at x.Arrived(), when the engine began deciding, not at x.Start(), which it
// restarts for execution, so that time spent on EXPLAIN or waiting for capacity (max_wait)
// shows in the caller's trace; the duration metric measures execution only. On the
// fast path (no budget) nothing happened before, and the timestamp option would cost an
// allocation per statement. It returns ctx carrying the span.
func (t *telemetry) startSpan(ctx context.Context, x *engine.Exec, always bool) (context.Context, trace.Span) {
	if !x.Observed {
		return ctx, idleSpan // Wants had no WantSpans: the idle global provider records nothing
	}
	if always || len(x.Budgets) > 0 {
		return t.tracer.Start(ctx, spanName(x), clientKind, trace.WithTimestamp(x.Arrived()))
	}
	return t.tracer.Start(ctx, spanName(x), clientKind)
}

// Started starts x's span and returns ctx carrying it, as otelpgx's TraceQueryStart does; the
// front end keeps it with the statement, and Finished gets it back (engine.Observer). A
// statement decided again (x.Resumed) has its span in ctx already: it is annotated anew.
func (t *telemetry) Started(ctx context.Context, x *engine.Exec) context.Context {
	if !x.Observed {
		return ctx // no span (Finished finds none to end)
	}
	ctx, span := t.span(ctx, x, false)
	if span.IsRecording() {
		t.setAttributes(span, x, x.Decision, x.Reason)
		warnEvents(span, x, 0)
		if started := decisionOf(x); started != allowed || x.Resumed {
			ctx = context.WithValue(ctx, startedKey{}, started)
		}
	}
	return ctx
}

// span returns the span of x's decision and ctx carrying it: the one an earlier decision of x
// began, which ctx carries (x.Resumed), its decision's attributes cleared, or a new one
// (startSpan, always as there).
func (t *telemetry) span(ctx context.Context, x *engine.Exec, always bool) (context.Context, trace.Span) {
	if !x.Resumed {
		return t.startSpan(ctx, x, always)
	}
	span := trace.SpanFromContext(ctx)
	// A span keeps the attributes it was given: the ones this decision may leave out
	// (attributes) are emptied, for it to set its own.
	span.SetAttributes(attribute.String(attrDecision, ""), attribute.String(attrReason, ""),
		attribute.StringSlice(attrBudgets, nil))
	return ctx, span
}

// spanDecision is a span's pgtraffic.decision and pgtraffic.reason. The engine may decide a
// statement again after Started annotated its span (at Finish, a statement that ran past a
// max_duration is its budget's block, or a warning), so Finished compares the statement's
// final decision with the one Started recorded. That one travels in the context Started
// returns, as the span does, and only when it is not allowed: an allowed statement, the common
// case, carries nothing and costs no allocation.
type spanDecision struct {
	decision, reason string
	warnings         int // how many warnings its span has an event of
}

// startedKey is the context key of the spanDecision Started recorded.
type startedKey struct{}

// allowed is the decision of a statement allowed cleanly, which the context leaves out.
var allowed = spanDecision{decision: engine.DecisionAllow}

func decisionOf(x *engine.Exec) spanDecision {
	return spanDecision{x.Decision, x.Reason, len(x.Warnings())}
}

// warnEvents adds to a warned statement's span a pgtraffic.warn event for each warning about x
// from its from-th on: its reason, and in pgtraffic.budgets the budget or guard that warned (a
// statement a guard warned about, and a budget with room admitted, was warned by the guard).
func warnEvents(span trace.Span, x *engine.Exec, from int) {
	for _, w := range x.Warnings()[from:] {
		span.AddEvent(eventWarn, trace.WithAttributes(
			attribute.String(attrReason, w.Reason),
			attribute.StringSlice(attrBudgets, []string{w.Budget})))
	}
}

// Blocked records a statement that was never sent: a span with error status (so that a
// blocked statement shows in the caller's trace) and, for a denial, a block decision.
func (t *telemetry) Blocked(ctx context.Context, x *engine.Exec, err error) {
	_, span := t.span(ctx, x, true)
	var d *engine.Denial
	status := ""
	if errors.As(err, &d) {
		status = blockedStatus(d.Budget, d.Reason)
	} else if x.Decision == engine.DecisionBlock && x.Blocker != "" {
		// The caller's context ended while the statement waited for capacity (max_wait): its
		// budget kept it out until then, and counts it as refused for what it waited for; err
		// is the context's. Or its max_duration passed in its EXPLAIN: its budget counts it as
		// cut off (reason max_duration); err matches ErrOverrun. (A batch's other statements,
		// refused with it, name no budget: no budget's decision is counted for them.)
		d = &engine.Denial{Budget: x.Blocker, Reason: x.Reason}
		while := " while waiting for capacity ("
		if x.Reason == ReasonMaxDuration {
			while = " in its EXPLAIN, before it was sent ("
		}
		status = "pgtraffic: " + errorType(err) + while + blockedStatus(d.Budget, d.Reason) + ")"
	}
	denied := d != nil
	if span.IsRecording() {
		if denied {
			t.setAttributes(span, x, engine.DecisionBlock, d.Reason)
			// A denial's budget may be a guard, which is not among x.Budgets.
			span.SetAttributes(attribute.String(attrBudget, d.Budget),
				attribute.String(attrErrorType, errorType(err)))
			span.SetStatus(codes.Error, status)
		} else {
			// The caller's context ended before the statement was decided (while it waited for
			// an EXPLAIN's connection, or for the EXPLAIN): no decision, no pgtraffic.decision;
			// its error.type and status say what happened.
			t.setAttributes(span, x, "", "")
			span.SetAttributes(attribute.String(attrErrorType, errorType(err)))
			span.SetStatus(codes.Error, "pgtraffic: "+errorType(err)+" before the statement was decided")
		}
	}
	span.End()
	if denied && t.decisions.Enabled(ctx) {
		t.countDecision(ctx, d.Budget, engine.DecisionBlock, d.Reason)
	}
}

// Finished ends x's span, which ctx carries (Started returned it), and records the duration.
func (t *telemetry) Finished(ctx context.Context, x *engine.Exec, err error, d time.Duration) {
	if x.Observed { // else ctx carries the caller's span, if any: not ours to end
		span := trace.SpanFromContext(ctx)
		// A decision never goes back to allow, so a statement allowed now was allowed at
		// Started: only another one looks for what Started recorded.
		if decisionOf(x) != allowed && span.IsRecording() {
			redecided(ctx, span, x)
		}
		if err != nil && span.IsRecording() {
			span.SetAttributes(attribute.String(attrErrorType, errorType(err)))
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				span.SetAttributes(attribute.String(attrStatusCode, pgErr.Code))
			}
			// The description is the SQLSTATE or type, never the message: a server message
			// can quote a literal or a bound value ("invalid input syntax for type integer: ...").
			// A statement blocked since Started (past its max_duration, or refused once it had
			// its pool connection) says by what, as a refused one's span does.
			status := errorType(err)
			if x.Decision == engine.DecisionBlock {
				status = blockedStatus(x.Blocker, x.Reason)
			}
			span.SetStatus(codes.Error, status)
		}
		span.End()
	}
	if x.Wants&engine.WantDuration != 0 && !x.InBatch {
		t.recordDuration(ctx, x, 0, err, d)
	}
}

// BatchFinished records a pgx batch's duration as one operation, as the semantic conventions
// count a batch: db.operation.name BATCH and db.operation.batch.size, for a batch of several
// statements; a batch of one is that statement's operation.
func (t *telemetry) BatchFinished(ctx context.Context, b *engine.Batch, err error, d time.Duration) {
	if n := len(b.Execs); n > 0 {
		t.recordDuration(ctx, &b.Execs[0], n, err, d)
	}
}

// recordDuration records d, the duration of statement x or, when batch is above 1, of the batch
// of that many statements that x begins, which ended with err.
func (t *telemetry) recordDuration(ctx context.Context, x *engine.Exec, batch int, err error, d time.Duration) {
	var buf [10]attribute.KeyValue
	attrs := append(buf[:0], t.metricAttr...)
	switch {
	case batch > 1:
		attrs = append(attrs, attribute.String(attrOperation, batchOperation), attribute.Int(attrBatchSize, batch))
	default:
		if op := x.Pattern.Operation; op != "" {
			attrs = append(attrs, attribute.String(attrOperation, op))
		}
		if len(x.Pattern.Tables) == 1 {
			attrs = append(attrs, attribute.String(attrCollection, x.Pattern.Tables[0]))
		}
	}
	if err != nil {
		attrs = append(attrs, attribute.String(attrErrorType, errorType(err)))
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) {
			attrs = append(attrs, attribute.String(attrStatusCode, pgErr.Code))
		}
	}
	t.duration.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
}

// redecided brings span, which Started annotated and ctx carries, up to x's final decision
// when the engine decided x again since (as the decisions metric and the log count it): its
// decision and reason, and for a warning the event Started adds to a warned statement's span.
func redecided(ctx context.Context, span trace.Span, x *engine.Exec) {
	started, ok := ctx.Value(startedKey{}).(spanDecision)
	if !ok {
		started = allowed
	}
	if decisionOf(x) == started {
		return
	}
	span.SetAttributes(attribute.String(attrDecision, x.Decision), attribute.String(attrReason, x.Reason))
	warnEvents(span, x, started.warnings)
	if x.Decision == engine.DecisionBlock {
		span.SetAttributes(attribute.String(attrBudget, x.Blocker))
	}
}

// blockedStatus is the status description of a statement that budget (or guard) blocked for
// reason.
func blockedStatus(budget, reason string) string {
	return "pgtraffic: blocked by " + budget + " (" + reason + ")"
}

// Decision counts one budget's decision; the engine calls it only when Wants had WantDecisions.
func (t *telemetry) Decision(budget, decision, reason string) {
	t.countDecision(context.Background(), budget, decision, reason)
}

// countDecision adds one to pgtraffic.decisions, in ctx (a blocked statement's span's: an
// exemplar's).
func (t *telemetry) countDecision(ctx context.Context, budget, decision, reason string) {
	t.decisions.Add(ctx, 1, t.connectorAttr, metric.WithAttributes(
		attribute.String(attrBudget, budget),
		attribute.String(attrDecision, decision),
		attribute.String(attrReason, reason)))
}

// attributes are the span attributes of a statement. db.query.text is the normalised text:
// pg_query replaces every literal with $n ("" for unparsable text, never the raw text), and
// bound values are never read. It is at most bounded.QueryLen bytes: package pattern cuts it
// once per pattern, so a bulk INSERT's VALUES list does not put megabytes in every span.
//
// Every string is valid UTF-8: the pattern's are (package pattern guarantees it once, when it
// analyses the text); tags are untrusted (a comment, a request path), so each tag key and value
// is made valid and cut to the bounds of package bounded here.
//
// db.collection.name is set only when the statement names exactly one table: the conventions
// say not to pick one of several collections out of the query text.
//
// decision and reason are pgtraffic.decision and pgtraffic.reason, each left out when "".
func (t *telemetry) attributes(attrs []attribute.KeyValue, x *engine.Exec, decision, reason string) []attribute.KeyValue {
	p := x.Pattern
	attrs = append(attrs, t.commonAttr...)
	if p.Normalized != "" {
		attrs = append(attrs, attribute.String(attrQueryText, p.Normalized))
	}
	if p.Summary != "" {
		attrs = append(attrs, attribute.String(attrQuerySummary, p.Summary))
	}
	attrs = append(attrs, attribute.String(attrFingerprint, p.Fingerprint))
	if decision != "" {
		attrs = append(attrs, attribute.String(attrDecision, decision))
	}
	if p.Operation != "" {
		attrs = append(attrs, attribute.String(attrOperation, p.Operation))
	}
	if len(p.Tables) == 1 {
		attrs = append(attrs, attribute.String(attrCollection, p.Tables[0]))
	}
	if len(x.Budgets) > 0 {
		attrs = append(attrs, attribute.StringSlice(attrBudgets, x.Budgets))
	}
	if reason != "" {
		attrs = append(attrs, attribute.String(attrReason, reason))
	}
	if x.Costed {
		attrs = append(attrs, attribute.Float64(attrPredicted, x.Predicted))
		if x.PlanCost > 0 {
			attrs = append(attrs, attribute.Float64(attrPlanCost, x.PlanCost))
		}
	}
	// Tags: one attribute per key; a multi-valued key (table) becomes a string slice. The merged
	// tags are grouped by key (built-ins, then comment tags, then context tags, each key once),
	// and the first maxSpanTags keys are set.
	for i, n := 0, 0; i < len(x.Tags) && n < maxSpanTags; n++ {
		k := x.Tags[i].Key
		j := i + 1
		for j < len(x.Tags) && x.Tags[j].Key == k {
			j++
		}
		if k != vocab.KeyFingerprint { // already pgtraffic.fingerprint
			key := t.tagKey(k)
			if j-i == 1 {
				attrs = append(attrs, key.String(tagValue(x.Tags[i].Value)))
			} else {
				vals := make([]string, 0, j-i)
				for _, kv := range x.Tags[i:j] {
					vals = append(vals, tagValue(kv.Value))
				}
				attrs = append(attrs, key.StringSlice(vals))
			}
		}
		i = j
	}
	return attrs
}

// setAttributes sets x's attributes (see attributes) on span, built in a pooled buffer: the SDK
// copies them, so a span costs no allocation of its attribute list.
func (t *telemetry) setAttributes(span trace.Span, x *engine.Exec, decision, reason string) {
	buf, _ := t.attrBufs.Get().(*[]attribute.KeyValue)
	if buf == nil {
		buf = new([]attribute.KeyValue)
	}
	attrs := t.attributes((*buf)[:0], x, decision, reason)
	span.SetAttributes(attrs...)
	clear(attrs) // pin no strings of this statement in the pool
	*buf = attrs[:0]
	t.attrBufs.Put(buf)
}

func tagValue(v string) string { return bounded.Text(v, bounded.ValueLen) }

// maxSpanTags bounds the tag attributes of a span: the OpenTelemetry SDK keeps 128 attributes
// a span by default and drops those set past them, and the ones a statement's end sets
// (error.type, db.response.status_code, pgtraffic.budget) come last. The built-in tags come
// first, then the comment tags (at most 32) and the context tags.
const maxSpanTags = 64

// maxTagKeys bounds telemetry.tagKeys.
const maxTagKeys = 256

// tagKey returns the span attribute key of tag key k, pgtraffic.tag.<k> with k made bounded
// text, without allocating for the built-in keys and the first maxTagKeys others.
func (t *telemetry) tagKey(k string) attribute.Key {
	switch k {
	case vocab.KeyUsername:
		return attrTagPrefix + vocab.KeyUsername
	case vocab.KeyDatabase:
		return attrTagPrefix + vocab.KeyDatabase
	case vocab.KeyApplicationName:
		return attrTagPrefix + vocab.KeyApplicationName
	case vocab.KeyStatement:
		return attrTagPrefix + vocab.KeyStatement
	case vocab.KeyTable:
		return attrTagPrefix + vocab.KeyTable
	}
	m := t.tagKeys.Load()
	if m != nil {
		if key, ok := (*m)[k]; ok {
			return key
		}
	}
	key := attribute.Key(attrTagPrefix + bounded.Text(k, bounded.KeyLen))
	if m == nil || len(*m) < maxTagKeys {
		t.mu.Lock()
		// Copy the current map (another span may have replaced m since) with k added.
		next := map[string]attribute.Key{}
		if cur := t.tagKeys.Load(); cur != nil {
			next = maps.Clone(*cur)
		}
		if len(next) < maxTagKeys {
			next[k] = key
			t.tagKeys.Store(&next)
		}
		t.mu.Unlock()
	}
	return key
}

// errorType is the error.type attribute: the SQLSTATE for server errors, else a short fixed
// name. It never contains message text (which could quote a literal or a bound value).
func errorType(err error) string {
	var pgErr *pgconn.PgError
	var d *engine.Denial
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.As(err, &d):
		return "pgtraffic.blocked"
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	return "_OTHER"
}

// outgoing returns the text to send for sql, the statement o runs, decided in t: sql
// unchanged unless WithSQLCommenter is on, in
// which case the statement's context tags and, for a sampled span, its W3C traceparent (and
// tracestate) are appended as a sqlcommenter comment. Bound values are never read. Prepared
// statements (db.Prepare) keep the text they were prepared with, and so does a statement run by
// the name of one prepared on a pool's connections (byName: sql is that name, decided as the
// statement's text, dest.text): a comment would make it another name.
//
// Every traceparent makes the text unique, hence a new prepared statement in pgx's cache
// (cache_statement mode): one prepare per statement (BenchmarkSQLCommenter in integration/
// measures it), so the commenter is off by default. An unsampled span's traceparent names a trace no backend
// holds, so it is left out: unsampled statements carry only their tags, whose texts repeat and
// stay cached. A statement that already carries a comment is sent unchanged (tagging.Append
// follows the sqlcommenter spec).
func (i *interceptor) outgoing(o *openStmt, t *ticket, sql string, byName bool) string {
	if !i.commenter || byName || oneWord(sql) {
		return sql
	}
	return commented(o.ctx, t.Observed, sql)
}

// outgoingBatch returns the batch to send for b, the batch j runs at d, decided under ctx: b
// unless WithSQLCommenter is on, in which case a copy of b (the caller's batch is left as
// queued) whose statements each carry their comment, as outgoing gives a statement, with the
// traceparent of the statement's own span. A statement queued by the name of a prepared
// statement, and the BEGIN of a BeginTx batch, are sent as queued.
func (i *interceptor) outgoingBatch(ctx context.Context, d *dest, j *batchJob, b *pgx.Batch) *pgx.Batch {
	if !i.commenter {
		return b
	}
	out := *b
	out.QueuedQueries = make([]*pgx.QueuedQuery, len(b.QueuedQueries))
	for k, qq := range b.QueuedQueries {
		c := *qq
		if s := k - j.skip; s >= 0 && d.text(qq.SQL) == qq.SQL && !oneWord(qq.SQL) {
			c.SQL = commented(j.StatementContext(ctx, s), j.Execs[s].Observed, qq.SQL)
		}
		out.QueuedQueries[k] = &c
	}
	return &out
}

// oneWord reports whether sql is one word: the name of a statement prepared on the connection
// out of pgtraffic's sight (PoolConn.Conn().Prepare), which pgx runs by that name and a comment
// would make SQL, or a one-word command (COMMIT) that a comment tells no server-side tool much.
func oneWord(sql string) bool { return strings.IndexFunc(sql, unicode.IsSpace) < 0 }

// commented returns query with ctx's tags and, for a sampled span of the statement's own
// (observed: ctx carries the span the telemetry started), its traceparent appended as a
// sqlcommenter comment (see outgoing).
func commented(ctx context.Context, observed bool, query string) string {
	kv := make([]string, 0, 8)
	for k, v := range tagging.From(ctx).All() {
		kv = append(kv, k, v)
	}
	if observed && trace.SpanContextFromContext(ctx).IsSampled() {
		carrier := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(ctx, carrier)
		for _, k := range [...]string{"traceparent", "tracestate"} {
			if v := carrier.Get(k); v != "" {
				kv = append(kv, k, v)
			}
		}
	}
	if len(kv) == 0 {
		return query
	}
	return tagging.Append(query, tagging.New(kv...))
}

// observables makes the observable instruments of one meter, collecting their errors.
type observables struct {
	m    metric.Meter
	errs []error
}

func (b *observables) floatGauge(name, unit, desc string) metric.Float64ObservableGauge {
	g, err := b.m.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.errs = append(b.errs, err)
	return g
}

func (b *observables) intGauge(name, unit, desc string) metric.Int64ObservableGauge {
	g, err := b.m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.errs = append(b.errs, err)
	return g
}

func (b *observables) counter(name, unit, desc string) metric.Int64ObservableCounter {
	c, err := b.m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
	b.errs = append(b.errs, err)
	return c
}
