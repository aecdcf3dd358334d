package engine

import (
	"context"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBatchWarnsEachStatement: enforce refuses a batch whole, one block a statement; warn mode
// warns about each statement that enforce would refuse with it, not only the first that
// selected the budget: the batch's three statements are each warned, and the budget counts
// three warnings, as its enforce twin counts three blocks.
func TestBatchWarnsEachStatement(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: dry, mode: warn, max_concurrent: 1}
  - {name: wet, mode: enforce, max_concurrent: 1}
rules:
  - {budget: dry, match: {app: dry}}
  - {budget: wet, match: {app: wet}}
`)
	queries := []string{"select 1", "select 2", "select 3"}
	for _, app := range []string{"dry", "wet"} {
		ctx := tagging.With(context.Background(), "app", app)
		held, err := begin(e, ctx, "select 0") // the only slot
		if err != nil {
			t.Fatal(err)
		}
		var b Batch
		err = e.BeginBatch(ctx, &b, nil, queries, nil)
		if err == nil {
			defer b.Finish(ctx, nil)
		}
		held.Finish(ctx, nil)
	}
	var warned, blocked int64
	for _, bs := range e.Budgets() {
		switch bs.Name {
		case "dry":
			warned = int64(bs.Decisions.Warned)
		case "wet":
			blocked = int64(bs.Decisions.Blocked)
		}
	}
	if blocked != 3 || warned != 3 {
		t.Errorf("enforce counted %d blocked, warn %d warned; want 3 and 3 (one a statement)", blocked, warned)
	}
}
