package integration

import (
	"context"
	"slices"
	"testing"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSQLCommenterBatch: WithSQLCommenter "appends each statement's context tags and, when its
// span is sampled, its W3C traceparent to the SQL text", so the statements of a pgx batch (sqlc's
// :batchexec, :batchone, :batchmany) reach the server with them too, each with its own span's
// traceparent, through the pool and a transaction, in a batch that begins one (its BEGIN is
// sent as queued), and with the queued queries' callbacks run on their results. The caller's
// batch keeps its texts. The server's own view of each statement's text (current_query())
// shows what was sent.
func TestSQLCommenterBatch(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	spans := tracetest.NewInMemoryExporter()
	pool := openSizedPool(t, dsn, 2, driver.WithSQLCommenter(true),
		driver.WithTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))))
	ctx := tagging.With(context.Background(), "app", "web")
	const q = "select current_query()"

	check := func(what string, beginTx bool, send func(*pgx.Batch) pgx.BatchResults) {
		t.Helper()
		spans.Reset()
		b := &pgx.Batch{}
		if beginTx {
			b.BeginTx(pgx.TxOptions{})
		}
		var texts [2]string
		b.Queue(q).QueryRow(func(r pgx.Row) error { return r.Scan(&texts[0]) })
		b.Queue(q).QueryRow(func(r pgx.Row) error { return r.Scan(&texts[1]) })
		br := send(b)
		if err := br.Close(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if tx := br.Tx(); tx != nil {
			if err := tx.Commit(ctx); err != nil {
				t.Fatalf("%s: commit: %v", what, err)
			}
		}
		for _, qq := range b.QueuedQueries[len(b.QueuedQueries)-2:] {
			if qq.SQL != q {
				t.Errorf("%s: the caller's batch was rewritten: %q", what, qq.SQL)
			}
		}
		var want []string // each statement's own span's traceparent
		for _, sp := range spans.GetSpans() {
			if sp.Name == "SELECT" {
				sc := sp.SpanContext
				want = append(want, "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01")
			}
		}
		var got []string
		for i, s := range texts {
			tags := tagging.Parse(s)
			if v, ok := tags.Get("app"); !ok || v != "web" {
				t.Errorf("%s: statement %d reached the server as %q, without its context tags", what, i, s)
			}
			tp, _ := tags.Get("traceparent")
			got = append(got, tp)
		}
		slices.Sort(got)
		slices.Sort(want)
		if len(want) != 2 || !slices.Equal(got, want) {
			t.Errorf("%s: traceparents %q, want each statement's own span's %q", what, got, want)
		}
	}
	check("Pool.SendBatch", false, func(b *pgx.Batch) pgx.BatchResults { return pool.SendBatch(ctx, b) })
	check("a batch that begins a transaction", true, func(b *pgx.Batch) pgx.BatchResults { return pool.SendBatch(ctx, b) })
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	check("Tx.SendBatch", false, func(b *pgx.Batch) pgx.BatchResults { return tx.SendBatch(ctx, b) })
}
