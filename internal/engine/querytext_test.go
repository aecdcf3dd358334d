package engine

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// bulkInsertHead is how the normalised text of every bulkInsert begins.
const bulkInsertHead = "INSERT INTO items (id, name) VALUES ($1, $2), ($3, $4), "

// bulkInsert is an INSERT of rows rows of inline literals, as a bulk loader builds it: its
// normalised text is about 20 bytes a row.
func bulkInsert(rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO items (id, name) VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d, 'name %d')", i, i)
	}
	return b.String()
}

// checkQueryText fails unless q is a bulk INSERT's normalised text cut as bounded.QueryLen
// bounds it: valid UTF-8, within the bound, the statement's beginning kept, a marker at its end.
func checkQueryText(t *testing.T, where, q string) {
	t.Helper()
	if len(q) > bounded.QueryLen || !utf8.ValidString(q) {
		t.Errorf("%s: a query text of %d bytes (valid UTF-8: %v), want at most %d", where, len(q), utf8.ValidString(q), bounded.QueryLen)
		return
	}
	if !strings.HasPrefix(q, bulkInsertHead) || !strings.Contains(q[len(q)-32:], "bytes cut)") {
		t.Errorf("%s: query text %.80q … %q, want the statement's beginning and a marker of what was cut", where, q, q[max(0, len(q)-32):])
	}
}

// A bulk INSERT's normalised text (about 200 KiB here) leaves the engine cut to
// bounded.QueryLen wherever it is shown: the statement's debug log, the status's patterns, its
// recent refusals and its quarantines.
func TestQueryTextBounded(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e, clk := newEngine(t, `
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, per_query_limit: 1h, quarantine: {after: 1, for: 1m}}
rules:
  - {budget: r, match: {app: r}}
`, func(o *Options) { o.Logger = log })
	ctx := tagging.With(context.Background(), "app", "r")
	bulk := bulkInsert(10_000)

	for range 2 {
		if err := run(e, clk, ctx, bulk, 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	overrun(t, e, clk, ctx, bulk) // quarantined at its first strike
	if d := denial(t, run(e, clk, ctx, bulk, 0)); d.Reason != vocab.ReasonQuarantine {
		t.Fatalf("denial %+v, want a quarantine", d)
	}

	var logged int
	sc := bufio.NewScanner(&buf)
	sc.Buffer(nil, 1<<30)
	for sc.Scan() {
		var line struct{ Msg, Query string }
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatalf("log line: %v", err)
		}
		if line.Msg == "pgtraffic: statement" {
			logged++
			checkQueryText(t, "debug log", line.Query)
		}
	}
	if logged != 4 {
		t.Errorf("%d statements in the debug log, want 4", logged)
	}
	top := e.TopPatterns(10)
	if len(top) != 1 {
		t.Fatalf("TopPatterns: %d patterns, want 1", len(top))
	}
	checkQueryText(t, "TopPatterns", top[0].Text)
	blocks := e.RecentBlocks()
	if len(blocks) != 2 {
		t.Fatalf("RecentBlocks: %d groups, want 2 (the overrun and the quarantine)", len(blocks))
	}
	for _, g := range blocks {
		checkQueryText(t, "RecentBlocks "+g.Reason, g.Query)
	}
	q := e.Quarantines()
	if len(q) != 1 {
		t.Fatalf("Quarantines: %d, want 1", len(q))
	}
	checkQueryText(t, "Quarantines", q[0].Query)
}
