package integration

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// panickingHandler is an application's slog handler that panics on a WARN record (a handler
// with a bug, or one that panics on purpose in a test build to catch warnings).
type panickingHandler struct{}

func (panickingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (panickingHandler) WithAttrs([]slog.Attr) slog.Handler       { return panickingHandler{} }
func (panickingHandler) WithGroup(string) slog.Handler            { return panickingHandler{} }
func (panickingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		panic("the application's log handler panicked on: " + r.Message)
	}
	return nil
}

// panickingProcessor is an application's span processor that panics when a span ends (an
// exporter with a bug).
type panickingProcessor struct{}

func (panickingProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (panickingProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	panic("the application's span processor panicked on span " + s.Name())
}
func (panickingProcessor) Shutdown(context.Context) error   { return nil }
func (panickingProcessor) ForceFlush(context.Context) error { return nil }

const leakPanicChildEnv = "PGTRAFFIC_LEAK_PANIC_CHILD"

// TestLeakedRowsUserCodePanicSurvived: driver/doc.go (Rows) promises "Rows dropped without
// Close have their slot released when the garbage collector finds them (counted in
// pgtraffic.rows.leaked and logged)", and the CHANGELOG that "a statement's holds are released
// on every path out of the driver, panics included".
//
// The leak cleanup (driver/leak.go, openStmt.reclaim) reaches the application's logger
// (WithLogger) and, as it ends the statement's span, its span processors, on the runtime's
// cleanup goroutine: a panic there, unrecovered, would end the whole process. The test runs
// that in a child process: the child leaks one rows (pool and database/sql) under a logger, or
// a span processor, that panics, collects it, and must get the slot back and exit.
func TestLeakedRowsUserCodePanicSurvived(t *testing.T) {
	if v := os.Getenv(leakPanicChildEnv); v != "" {
		leakPanicChild(t, v)
		return
	}
	for _, fe := range []string{"pool/logger", "sql/logger", "pool/tracer", "sql/tracer"} {
		t.Run(fe, func(t *testing.T) {
			dsn := pgtest.Shared(t).CreateDatabase(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLeakedRowsUserCodePanicSurvived$",
				"-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), leakPanicChildEnv+"="+fe+" "+dsn)
			out, err := cmd.CombinedOutput()
			text := string(out)
			if i := strings.Index(text, "panic: "); i >= 0 {
				text = text[i:min(len(text), i+1500)]
			} else if len(text) > 1500 {
				text = text[len(text)-1500:]
			}
			if err != nil {
				t.Fatalf("the process that leaked one rows under a logger that panics on WARN died: %v\n%s", err, text)
			}
			t.Logf("child:\n%s", text)
		})
	}
}

// leakPanicChild leaks one rows on the front end named in v ("pool/logger <dsn>", "sql/tracer
// <dsn>", ...), collects it, and waits for its slot to come back.
func leakPanicChild(t *testing.T, v string) {
	what, dsn, _ := strings.Cut(v, " ")
	fe, hook, _ := strings.Cut(what, "/")
	cfg, err := driver.ParseConfig([]byte(`
budgets:
  - {name: reports, mode: enforce, max_concurrent: 1}
rules:
  - {budget: reports, match: {app: reports}}
`))
	if err != nil {
		t.Fatal(err)
	}
	opts := []driver.Option{driver.WithConfig(cfg)}
	if hook == "logger" {
		opts = append(opts, driver.WithLogger(slog.New(panickingHandler{})))
	} else {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(panickingProcessor{}))
		opts = append(opts, driver.WithTracerProvider(tp))
	}
	ctx := tagging.With(context.Background(), "app", "reports")
	var (
		leak   func()
		status func() driver.BudgetStatus
	)
	switch fe {
	case "pool":
		p, err := driver.NewPool(context.Background(), dsn, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		leak = func() {
			rows, err := p.Query(ctx, "select generate_series(1, 10)")
			if err != nil {
				t.Fatal(err)
			}
			_ = rows // dropped without Close
		}
		status = func() driver.BudgetStatus { return poolBudget(t, p, "reports") }
	default:
		c, err := driver.NewConnector(dsn, opts...)
		if err != nil {
			t.Fatal(err)
		}
		db := sql.OpenDB(c)
		defer db.Close()
		leak = func() {
			rows, err := db.QueryContext(ctx, "select generate_series(1, 10)")
			if err != nil {
				t.Fatal(err)
			}
			_ = rows // dropped without Close
		}
		status = func() driver.BudgetStatus { return budgetStatus(t, c, "reports") }
	}
	leak()
	if n := status().InFlight; n != 1 {
		t.Fatalf("in flight after the leak: %d", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for status().InFlight != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the leaked rows' slot never came back")
		}
		runtime.GC()
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("child: the leaked rows' slot came back")
}
