package driver

import (
	"context"
	"errors"
	"testing"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// TestDatabaseTagDefaultsToUser: a DSN that names no database connects to the database
// named after the user (libpq's and PostgreSQL's default, which pgx follows by sending no
// database in the startup message). The built-in tag database must say so: a rule
// {database: app} must select the statements of postgres://app@host/ as it does those of
// postgres://app@host/app.
func TestDatabaseTagDefaultsToUser(t *testing.T) {
	t.Setenv("PGDATABASE", "")
	cfg, err := ParseConfig([]byte(`
budgets:
  - {name: closed, mode: enforce, max_concurrent: 0}
rules:
  - {budget: closed, match: {database: app}}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, dsn := range []string{"postgres://app@db.example:5433/app", "postgres://app@db.example:5433/"} {
		c, err := NewConnector(dsn, WithConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		err = c.Check(context.Background())
		c.Close()
		if !errors.Is(err, ErrBlocked) {
			t.Errorf("%s (database app): Check = %v, want the {database: app} rule's refusal", dsn, err)
		}
	}
}

// TestNamespaceAttributeIsUTF8: the package doc promises "Every attribute is valid UTF-8
// (invalid bytes replaced by U+FFFD)", because an OTLP exporter fails to marshal a batch with an
// invalid string (protobuf strings must be UTF-8) and drops every span in it. A database whose
// name is not UTF-8 (a LATIN1 or SQL_ASCII cluster's "café", written caf%E9 in the DSN) is put
// in db.namespace raw, on every span and duration point of the connector.
func TestNamespaceAttributeIsUTF8(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	var o options
	o.tracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	o.meterProvider = metricnoop.NewMeterProvider()
	cc, err := pgx.ParseConfig("postgres://app@db.example:5433/caf%E9")
	if err != nil {
		t.Fatal(err)
	}
	tel, err := newTelemetry(&o, cc)
	if err != nil {
		t.Fatal(err)
	}
	eng := engine.New(engine.Options{Observer: tel.observer(), Database: cc.Database, User: cc.User})
	x := new(engine.Exec)
	ctx, err := eng.Begin(context.Background(), x, nil, "SELECT 1 FROM t", nil)
	if err != nil {
		t.Fatal(err)
	}
	x.Finish(ctx, nil)
	spans := exp.GetSpans()
	if len(spans) != 1 {
		t.Fatalf("%d spans", len(spans))
	}
	for _, kv := range spans[0].Attributes {
		if kv.Value.Type() == attribute.STRING && !utf8.ValidString(kv.Value.AsString()) {
			t.Errorf("span attribute %s = %q is not valid UTF-8", kv.Key, kv.Value.AsString())
		}
	}
}
