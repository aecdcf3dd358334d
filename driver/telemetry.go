package driver

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const instrumentationName = "github.com/pgtraffic/pgtraffic"

// telemetry turns the engine's decisions into OpenTelemetry spans and metrics following the
// database semantic conventions (design.md §6). Span attributes are computed only for recording
// spans, so a provider that samples nothing costs little.
type telemetry struct {
	tracer     trace.Tracer
	duration   metric.Float64Histogram
	decisions  metric.Int64Counter
	serverAddr string
	serverPort int
	database   string
	commonAttr []attribute.KeyValue
}

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
		tracer:     tp.Tracer(instrumentationName),
		serverAddr: cc.Host,
		serverPort: int(cc.Port),
		database:   cc.Database,
	}
	meter := mp.Meter(instrumentationName)
	var err error
	t.duration, err = meter.Float64Histogram("db.client.operation.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Duration of database client operations."),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10))
	if err != nil {
		return nil, err
	}
	t.decisions, err = meter.Int64Counter("pgtraffic.decisions",
		metric.WithDescription("Traffic-control decisions per budget: allow, warn or block."))
	if err != nil {
		return nil, err
	}
	t.commonAttr = []attribute.KeyValue{
		attribute.String("db.system.name", "postgresql"),
		attribute.String("db.namespace", cc.Database),
		attribute.String("server.address", cc.Host),
		attribute.Int("server.port", int(cc.Port)),
	}
	return t, nil
}

func (t *telemetry) observer() engine.Observer { return t }

// spanName is db.query.summary: the operation and the first table, e.g. "SELECT orders".
func spanName(x *engine.Exec) string {
	if x.Pattern.Summary != "" {
		return x.Pattern.Summary
	}
	return "postgresql"
}

func (t *telemetry) Started(ctx context.Context, x *engine.Exec) {
	_, span := t.tracer.Start(ctx, spanName(x), trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(t.attributes(x)...)
		if x.Decision == engine.DecisionWarn {
			span.AddEvent("pgtraffic.warn", trace.WithAttributes(
				attribute.String("pgtraffic.reason", x.Reason)))
		}
	}
	x.Span = span
}

func (t *telemetry) Blocked(ctx context.Context, x *engine.Exec, err error) {
	_, span := t.tracer.Start(ctx, spanName(x), trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(t.attributes(x)...)
		span.SetAttributes(attribute.String("pgtraffic.decision", engine.DecisionBlock),
			attribute.String("error.type", errorType(err)))
		span.SetStatus(codes.Error, "blocked by pgtraffic")
	}
	span.End()
	var d *engine.Denial
	if errors.As(err, &d) {
		t.decisions.Add(ctx, 1, metric.WithAttributes(
			attribute.String("pgtraffic.budget", d.Budget),
			attribute.String("pgtraffic.decision", engine.DecisionBlock),
			attribute.String("pgtraffic.reason", d.Reason)))
	}
}

func (t *telemetry) Finished(ctx context.Context, x *engine.Exec, err error, d time.Duration) {
	if span, ok := x.Span.(trace.Span); ok {
		if err != nil && span.IsRecording() {
			span.SetAttributes(attribute.String("error.type", errorType(err)))
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) {
				span.SetAttributes(attribute.String("db.response.status_code", pgErr.Code))
			}
			span.SetStatus(codes.Error, "")
		}
		span.End()
	}
	if t.duration.Enabled(ctx) {
		attrs := []attribute.KeyValue{
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.operation.name", x.Pattern.Operation),
		}
		if len(x.Pattern.Tables) > 0 {
			attrs = append(attrs, attribute.String("db.collection.name", x.Pattern.Tables[0]))
		}
		if err != nil {
			attrs = append(attrs, attribute.String("error.type", errorType(err)))
		}
		t.duration.Record(ctx, d.Seconds(), metric.WithAttributes(attrs...))
	}
}

func (t *telemetry) Decision(budget, decision, reason string) {
	ctx := context.Background()
	if !t.decisions.Enabled(ctx) {
		return
	}
	t.decisions.Add(ctx, 1, metric.WithAttributes(
		attribute.String("pgtraffic.budget", budget),
		attribute.String("pgtraffic.decision", decision),
		attribute.String("pgtraffic.reason", reason)))
}

// attributes are the span attributes of a statement. db.query.text is the normalised text:
// pg_query replaces every literal with $n, and bound values are never read.
func (t *telemetry) attributes(x *engine.Exec) []attribute.KeyValue {
	p := x.Pattern
	attrs := make([]attribute.KeyValue, 0, len(t.commonAttr)+12+len(x.Tags))
	attrs = append(attrs, t.commonAttr...)
	if p.Normalized != "" {
		attrs = append(attrs, attribute.String("db.query.text", p.Normalized))
	}
	attrs = append(attrs,
		attribute.String("db.query.summary", spanName(x)),
		attribute.String("pgtraffic.fingerprint", p.Fingerprint),
		attribute.String("pgtraffic.decision", x.Decision),
	)
	if p.Operation != "" {
		attrs = append(attrs, attribute.String("db.operation.name", p.Operation))
	}
	if len(p.Tables) > 0 {
		attrs = append(attrs, attribute.String("db.collection.name", p.Tables[0]))
	}
	if len(x.Budgets) > 0 {
		attrs = append(attrs, attribute.StringSlice("pgtraffic.budgets", x.Budgets))
	}
	if x.Reason != "" {
		attrs = append(attrs, attribute.String("pgtraffic.reason", x.Reason))
	}
	if x.Costed {
		attrs = append(attrs, attribute.Float64("pgtraffic.predicted_cost_s", x.Predicted))
		if x.PlanCost > 0 {
			attrs = append(attrs, attribute.Float64("pgtraffic.plan_cost", x.PlanCost))
		}
	}
	// Tags: one attribute per key; a multi-valued key (table) becomes a string slice.
	for i := 0; i < len(x.Tags); {
		k := x.Tags[i].Key
		j := i + 1
		for j < len(x.Tags) && x.Tags[j].Key == k {
			j++
		}
		if k != engine.KeyFingerprint { // already pgtraffic.fingerprint
			if j-i == 1 {
				attrs = append(attrs, attribute.String("pgtraffic.tag."+k, x.Tags[i].Value))
			} else {
				vals := make([]string, 0, j-i)
				for _, kv := range x.Tags[i:j] {
					vals = append(vals, kv.Value)
				}
				attrs = append(attrs, attribute.StringSlice("pgtraffic.tag."+k, vals))
			}
		}
		i = j
	}
	return attrs
}

// errorType is the error.type attribute: the SQLSTATE class for server errors, else a short
// type name. It never contains message text (which could quote a literal).
func errorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		return pgErr.Code
	case errors.Is(err, context.Canceled):
		return "context.Canceled"
	case errors.Is(err, context.DeadlineExceeded):
		return "context.DeadlineExceeded"
	}
	var be *engine.Denial
	if errors.As(err, &be) {
		return "pgtraffic.blocked"
	}
	return "_OTHER"
}

// outgoing returns the statement text to send: unchanged unless WithSQLCommenter is on, in
// which case the statement's context tags and traceparent are appended as a sqlcommenter comment.
func (i *interceptor) outgoing(ctx context.Context, x *engine.Exec, query string) string {
	if !i.commenter {
		return query
	}
	kv := make([]string, 0, 8)
	for k, v := range tagging.From(ctx).All() {
		kv = append(kv, k, v)
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(spanContext(ctx, x), carrier)
	for _, k := range []string{"traceparent", "tracestate"} {
		if v := carrier.Get(k); v != "" {
			kv = append(kv, k, v)
		}
	}
	if len(kv) == 0 {
		return query
	}
	return tagging.Append(query, tagging.New(kv...))
}

// spanContext is ctx with the statement's span, so the traceparent names it.
func spanContext(ctx context.Context, x *engine.Exec) context.Context {
	if span, ok := x.Span.(trace.Span); ok {
		return trace.ContextWithSpan(ctx, span)
	}
	return ctx
}
