package engine

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// beginTime returns the least time of three Begins of q (each finished), on fresh
// engines so that no cache answers.
func beginTime(t *testing.T, rulesText, q string) time.Duration {
	t.Helper()
	best := time.Duration(1<<63 - 1)
	for range 2 {
		e, _ := newEngine(t, rulesText)
		ctx := tagging.With(context.Background(), "app", "x")
		start := time.Now()
		x, err := begin(e, ctx, q)
		d := time.Since(start)
		if err == nil {
			x.Finish(ctx, nil)
		}
		best = min(best, d)
	}
	return best
}

const linearRules = `
budgets:
  - {name: b, mode: enforce, max_concurrent: 100}
rules:
  - {budget: b, match: {app: x}}
`

// TestNestedLeadingCommentIsLinear: PostgreSQL nests block comments, and reads a
// statement led by a comment nested n deep in time proportional to its length. Deciding such a
// statement must too; the key of the pattern cache (pattern.Key, blockComment) rescans the
// rest of the text for "*/" once per level, its time grew with the square of the depth.
func TestNestedLeadingCommentIsLinear(t *testing.T) {
	const depth = 40_000
	nested := strings.Repeat("/* ", depth) + strings.Repeat("*/ ", depth) + "select 1"
	flat := "/* " + strings.Repeat("   ", 2*depth-2) + "*/ " + "select 1" // the same length, one level
	tf := beginTime(t, linearRules, flat)
	tn := beginTime(t, linearRules, nested)
	t.Logf("flat comment %v, nested %d deep %v (%d bytes)", tf, depth, tn, len(nested))
	if tn > 50*time.Millisecond && tn > 50*tf {
		t.Fatalf("deciding a %d-byte statement led by a comment nested %d deep took %v (%v for a flat comment of the same length)",
			len(nested), depth, tn, tf)
	}
}

// TestCommaFloodCommentIsLinear: a trailing comment of commas before one '=' is read by
// tagging.Parse on every statement (the text is too long for the text cache): its time must
// grow with the comment's length, not its square.
func TestCommaFloodCommentIsLinear(t *testing.T) {
	const n = 128 << 10
	flood := "select 1 /*" + strings.Repeat(",", n) + "=*/"
	plain := "select 1 /*" + strings.Repeat("a", n) + "=*/"
	tp := beginTime(t, linearRules, plain)
	tf := beginTime(t, linearRules, flood)
	t.Logf("plain %v, comma flood %v", tp, tf)
	if tf > 50*time.Millisecond && tf > 50*tp {
		t.Fatalf("deciding a statement whose %d-byte comment is commas took %v (%v for letters)", n, tf, tp)
	}
}

// TestPerTableKeysTheTableNotItsSpelling: a budget per: table keeps a count per table.
// {table: orders} matches public.orders (README: the bare name is a tag too), so a statement
// on public.orders is a statement on the same table as one on orders, and its per value is the
// first bare table name, whatever the spelling: schema-qualifying the name must not give the
// table a second slot.
func TestPerTableKeysTheTableNotItsSpelling(t *testing.T) {
	e, _ := newEngine(t, `
budgets:
  - {name: per-table, mode: enforce, max_concurrent: 1, per: table}
rules:
  - {budget: per-table, match: {table: orders}}
`)
	bg := context.Background()
	hold, err := begin(e, bg, "select * from orders")
	if err != nil {
		t.Fatal(err)
	}
	defer hold.Finish(bg, nil)
	for _, q := range []string{"select * from public.orders", `select * from "public"."orders"`} {
		x, err := begin(e, bg, q)
		if err == nil {
			x.Finish(bg, nil)
			t.Errorf("%s: admitted while orders' one slot is held; want it refused (concurrency) as a statement on orders", q)
			continue
		}
		if d := denial(t, err); d.Reason != "concurrency" {
			t.Errorf("%s: refused for %s; want concurrency", q, d.Reason)
		}
	}
}
