package integration

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchWarnModeWarnsEveryStatementEnforceBlocks: the README's rollout guide, step 1:
// "Add the budget in mode: warn ... Nothing is blocked; what enforce would block is logged ...,
// counted in pgtraffic.decisions{pgtraffic.decision="warn"} and marked with a pgtraffic.warn
// span event". BudgetStatus's doc: "Admitted, Warned and Blocked count the statements the
// budget decided ..., one decision per statement, exactly as the pgtraffic.decisions metric
// counts them"; "Warned ran with a warning (decision warn: in warn mode, a statement that
// enforce would have refused ...)".
//
// The same 3-statement batch, every statement selected by the budget, while the budget's only
// slot is held: the enforce budget refuses the batch and counts 3 blocks (one per statement);
// the warn budget, which must report what enforce would block, counts 3 warnings, and each
// statement's span carries a pgtraffic.warn event.
func TestBatchWarnModeWarnsEveryStatementEnforceBlocks(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	p, _ := openPool(t, `budgets:
  - {name: enf, mode: enforce, max_concurrent: 1}
  - {name: wrn, mode: warn, max_concurrent: 1}
rules:
  - {budget: enf, match: {app: e}}
  - {budget: wrn, match: {app: w}}
`, driver.WithTracerProvider(tp))
	bg := context.Background()
	batch := func() *pgx.Batch {
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue("select 2")
		b.Queue("select 3")
		return b
	}
	run := func(app string) driver.BudgetStatus {
		ctx := tagging.With(bg, "app", app)
		name := map[string]string{"e": "enf", "w": "wrn"}[app]
		// The budget's only slot is held by an open query.
		rows, err := p.Query(ctx, "select generate_series(1, 3)")
		if err != nil {
			t.Fatal(err)
		}
		before := poolBudget(t, p, name)
		spans.Reset()
		_ = p.SendBatch(ctx, batch()).Close()
		after := poolBudget(t, p, name)
		rows.Close()
		return driver.BudgetStatus{Name: name, Admitted: after.Admitted - before.Admitted,
			Warned: after.Warned - before.Warned, Blocked: after.Blocked - before.Blocked}
	}

	enf := run("e")
	if enf.Blocked != 3 {
		t.Fatalf("enforce: the refused batch counted %d blocks, want 3 (one per statement)", enf.Blocked)
	}
	wrn := run("w")
	warnEvents := 0
	for _, s := range spans.GetSpans() {
		for _, ev := range s.Events {
			if ev.Name == "pgtraffic.warn" {
				warnEvents++
				break
			}
		}
	}
	t.Logf("enforce: blocked %d; warn: warned %d, admitted %d, statement spans with a pgtraffic.warn event %d",
		enf.Blocked, wrn.Warned, wrn.Admitted, warnEvents)
	if wrn.Warned != enf.Blocked {
		t.Errorf("warn mode counted %d warnings (and %d statements admitted without one) for the batch that "+
			"enforce refused as %d blocked statements: warn mode must report what enforce would block", wrn.Warned, wrn.Admitted, enf.Blocked)
	}
	if warnEvents != 3 {
		t.Errorf("%d of the batch's 3 statement spans carry a pgtraffic.warn event, want 3", warnEvents)
	}
}
