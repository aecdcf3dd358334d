package driver

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// newSizedHarness is newTelHarness with a pattern cache of cacheSize (0: the default).
func newSizedHarness(t *testing.T, rules string, cacheSize int) *telHarness {
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
	for _, opt := range []Option{WithTracerProvider(h.tp), WithMeterProvider(mp),
		WithLogger(slog.New(slog.NewTextHandler(h.log, &slog.HandlerOptions{Level: slog.LevelDebug})))} {
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
	eo := engine.Options{
		Logger: o.logger, Now: h.clock.Now, User: cc.User, Database: cc.Database,
		Observer: h.tel.observer(), PatternCacheSize: cacheSize,
	}
	h.eng = engine.New(eo)
	h.rt = runtime.New(h.eng, runtime.Options{})
	cfg, err := ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.rt.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if err := h.tel.attach(h.rt); err != nil {
		t.Fatal(err)
	}
	intr := &interceptor{engine: h.eng}
	h.conn = &Connector{core: &core{engine: h.eng, rt: h.rt, intr: intr, tel: h.tel}, pgx: telConnector{sent: h.sent}}
	h.db = sql.OpenDB(h.conn)
	t.Cleanup(func() {
		h.db.Close()
		_ = h.tel.close()
	})
	return h
}

func runRows(t *testing.T, db *sql.DB, ctx context.Context, q string, args ...any) error {
	t.Helper()
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	return rows.Close()
}

// TestHottestPatternKeepsItsText: the status's hottest pattern, which is
// running all along (every other statement), must show its fingerprint and normalised text.
// Its hits are served by the engine's text cache, so they never set the pattern cache's CLOCK
// bit; inline-literal statements (distinct texts) then evict it from the pattern cache, where
// the status once looked its text up (the cost model keeps it now).
func TestHottestPatternKeepsItsText(t *testing.T) {
	h := newSizedHarness(t, telRules, 64) // WithPatternCacheSize(64); the default 10,000 behaves alike at scale
	costed := tagging.With(context.Background(), "app", "costed")
	blank, taken := 0, 0
	var last PatternStatus
	for i := range 1000 {
		if err := runRows(t, h.db, costed, "SELECT id FROM items WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
		if err := runRows(t, h.db, context.Background(), fmt.Sprintf("SELECT c FROM other WHERE id = %d", i)); err != nil {
			t.Fatal(err)
		}
		if i%10 == 9 {
			taken++
			s := h.conn.Snapshot()
			if len(s.Patterns) == 0 {
				t.Fatal("no patterns in the snapshot")
			}
			if p := s.Patterns[0]; p.Fingerprint == "" || p.Query == "" {
				blank++
				last = p
			}
		}
	}
	if blank > 0 {
		t.Errorf("the hottest pattern (running throughout) had no fingerprint or query in %d of %d snapshots, e.g. %+v",
			blank, taken, last)
	}
}

// TestHottestPatternKeepsItsTextPastTheCaches: with the default pattern
// cache, the pattern that ran most (and is still listed first, with its count) loses its
// fingerprint and normalised text once 20,000 other statement texts went by, e.g. inline
// literals that no budget costs: the cost model keeps the pattern, the pattern cache does not.
func TestHottestPatternKeepsItsTextPastTheCaches(t *testing.T) {
	h := newSizedHarness(t, telRules, 0)
	costed := tagging.With(context.Background(), "app", "costed")
	for range 50 {
		if err := runRows(t, h.db, costed, "SELECT id FROM items WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20000 {
		if err := runRows(t, h.db, context.Background(), fmt.Sprintf("SELECT c FROM other WHERE id = %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	s := h.conn.Snapshot()
	if len(s.Patterns) == 0 {
		t.Fatal("no patterns in the snapshot")
	}
	if p := s.Patterns[0]; p.Count != 50 || len(p.Fingerprint) != 16 || p.Query == "" {
		t.Errorf("hottest pattern %+v: want count 50, its fingerprint (16 hex digits) and its normalised text", p)
	}
}
