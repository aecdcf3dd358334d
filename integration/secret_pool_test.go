package integration

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSecretPool runs the pgx-native pool's front ends (Exec, Query, named arguments, the
// simple protocol, a batch, CopyFrom, a transaction) with secrets in literals, arguments and
// server errors, under a costed budget (EXPLAIN) and a guard, and looks for them in spans, logs
// (debug) and the Snapshot.
func TestSecretPool(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	var logs lockedBuffer
	p, _ := openPool(t, `budgets: [{name: all, mode: enforce, max_concurrent: 8, per_query_limit: 10s}, {name: no, mode: enforce, max_concurrent: 0}]
rules: [{budget: all, match: {app: t}}, {budget: no, match: {app: no}}]
guards: {require_where: enforce}
`, driver.WithTracerProvider(tp), driver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))),
		driver.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	ctx := tagging.With(context.Background(), "app", "t")
	if _, err := p.Exec(ctx, "create table users (id int primary key, email text unique, pin int)"); err != nil {
		t.Fatal(err)
	}
	var appErrs []string
	note := func(err error) {
		if err != nil {
			appErrs = append(appErrs, err.Error())
		}
	}
	_, err := p.Exec(ctx, "insert into users values (1, 'S3CRET-P1@x', 1)")
	note(err)
	_, err = p.Exec(ctx, "insert into users values (2, $1, 2)", "S3CRET-P1@x") // unique violation
	note(err)
	_, err = p.Exec(ctx, "select count(*) from users where pin = $1", "S3CRET-P2") // EXPLAIN and statement fail
	note(err)
	_, err = p.Exec(ctx, "select count(*) from users where pin = @pin", pgx.NamedArgs{"pin": "S3CRET-P3"})
	note(err)
	_, err = p.Exec(ctx, "select count(*) from users where email = $1 and pin = $2", pgx.QueryExecModeSimpleProtocol, "S3CRET-P4", "S3CRET-P5")
	note(err)
	rows, err := p.Query(ctx, "select ('S3CRET-P6' || id)::int from users")
	if err == nil {
		for rows.Next() {
		}
		note(rows.Err())
		rows.Close()
	}
	var n int
	note(p.QueryRow(ctx, "select pin from users where email = $1", "S3CRET-P7").Scan(&n))
	_, err = p.Exec(ctx, "update users set email = 'S3CRET-P8'")
	note(err)
	_, err = p.Exec(tagging.With(ctx, "app", "no"), "select * from users where email = 'S3CRET-P9'")
	note(err)
	b := &pgx.Batch{}
	b.Queue("insert into users values (3, 'S3CRET-P10', 3)")
	b.Queue("insert into users values (3, $1, 3)", "S3CRET-P11")
	b.Queue("select $1::int", "S3CRET-P12")
	note(p.SendBatch(ctx, b).Close())
	_, err = p.CopyFrom(ctx, pgx.Identifier{"users"}, []string{"id", "email", "pin"},
		pgx.CopyFromRows([][]any{{1, "S3CRET-P13", 1}}))
	note(err)
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "select count(*) from users where pin = $1 and email = 'S3CRET-P14'", "S3CRET-P15")
	note(err)
	tx.Rollback(ctx)

	for _, sp := range spans.GetSpans() {
		all := sp.Name + " " + sp.Status.Description + " " + spanAttrText(sp.Attributes)
		for _, ev := range sp.Events {
			all += " event " + ev.Name + " " + spanAttrText(ev.Attributes)
		}
		if strings.Contains(all, secretMarker) {
			t.Errorf("span leaks a secret: %s", all)
		}
	}
	for _, line := range strings.Split(logs.String(), "\n") {
		if strings.Contains(line, secretMarker) {
			t.Errorf("log leaks a secret: %s", line)
		}
	}
	snap, _ := json.Marshal(p.Snapshot())
	if strings.Contains(string(snap), secretMarker) {
		t.Errorf("Snapshot leaks a secret: %s", excerpt(string(snap), secretMarker))
	}
	if !strings.Contains(logs.String(), "EXPLAIN failed") {
		t.Errorf("no EXPLAIN failure was logged: the sweep did not reach it")
	}
	t.Logf("application errors: %q", appErrs)
}
