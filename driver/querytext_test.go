package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A bulk INSERT's normalised text (about 200 KiB here) is cut to bounded.QueryLen wherever the
// connector shows it: each span's db.query.text and the status's patterns and recent refusals,
// as JSON and as HTML. What is kept is valid UTF-8 and begins as the statement does.
func TestQueryTextBounded(t *testing.T) {
	if bounded.QueryLen != 4<<10 {
		t.Errorf("bounded.QueryLen is %d bytes: the package doc, the README and the CHANGELOG say 4 KiB", bounded.QueryLen)
	}
	h := newTelHarness(t, telRules)
	const head = "INSERT INTO items (id, name) VALUES ($1, $2), ($3, $4), "
	var b strings.Builder
	b.WriteString("INSERT INTO items (id, name) VALUES ")
	for i := range 10_000 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d, 'name é %d')", i, i)
	}
	bulk := b.String()
	check := func(where, q string) {
		t.Helper()
		if len(q) > bounded.QueryLen || !utf8.ValidString(q) {
			t.Errorf("%s: a query text of %d bytes (valid UTF-8: %v), want at most %d", where, len(q), utf8.ValidString(q), bounded.QueryLen)
			return
		}
		if !strings.HasPrefix(q, head) || !strings.Contains(q[len(q)-32:], "bytes cut)") {
			t.Errorf("%s: query text %.80q … %q, want the statement's beginning and a marker of what was cut", where, q, q[max(0, len(q)-32):])
		}
	}

	costed := tagging.With(context.Background(), "app", "costed")
	for range 2 {
		if _, err := h.db.ExecContext(costed, bulk); err != nil {
			t.Fatal(err)
		}
	}
	reporting := tagging.With(context.Background(), "app", "reporting")
	release := h.hold(t, reporting)
	if _, err := h.db.ExecContext(reporting, bulk); !errors.Is(err, ErrBlocked) {
		t.Fatalf("want a block, got %v", err)
	}
	release()

	var spans int
	for _, s := range h.spans.GetSpans() {
		if s.Name == "INSERT items" {
			spans++
			check("span "+attrOf(s.Attributes, "pgtraffic.tag.app").AsString(), attrOf(s.Attributes, "db.query.text").AsString())
		}
	}
	if spans != 3 {
		t.Errorf("%d INSERT spans, want 3 (all: %v)", spans, spanNames(h.spans.GetSpans()))
	}

	resp := statusGet(t, h.conn.Handler(), http.MethodGet, "/?format=json", "")
	body, _ := io.ReadAll(resp.Body)
	var s Snapshot
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatal(err)
	}
	var patterns int
	for _, p := range s.Patterns {
		if strings.HasPrefix(p.Query, "INSERT") {
			patterns++
			check("status pattern", p.Query)
		}
	}
	if patterns != 1 || len(s.RecentBlocks) != 1 {
		t.Fatalf("status: %d INSERT patterns and %d groups of refusals, want 1 and 1", patterns, len(s.RecentBlocks))
	}
	check("status recent refusal", s.RecentBlocks[0].Query)

	// The page shows the texts as they were cut: the beginning, the marker, not the 1,000th row.
	resp = statusGet(t, h.conn.Handler(), http.MethodGet, "/", "text/html")
	body, _ = io.ReadAll(resp.Body)
	page := string(body)
	if strings.Count(page, head) != 2 || strings.Count(page, " bytes cut)") != 2 || strings.Contains(page, "($1999, $2000)") {
		t.Errorf("status page: %d texts beginning as the statement, %d cut, the 1,000th row shown: %v; want 2, 2 and not",
			strings.Count(page, head), strings.Count(page, " bytes cut)"), strings.Contains(page, "($1999, $2000)"))
	}
}
