package driver

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCutTagValuesDoNotPinTheWholeValue: the README says a tag becomes the span
// attribute pgtraffic.tag.<key>, and the telemetry cuts a tag value to 256 bytes ("a route or
// an attribute past them is cut"), so that a value a client chose (a header, a path) costs a
// span at most that much. A span lives on after its statement: a BatchSpanProcessor queues up
// to 2,048 of them for export, a tail sampler holds whole traces. Were the cut value a
// substring of the original, each span's 256-byte attribute would keep the whole value alive:
// 64 spans of statements tagged with a 1 MiB value would pin 64 MiB, where 64 × 256 bytes is
// what they hold. The cut copies what it keeps.
func TestCutTagValuesDoNotPinTheWholeValue(t *testing.T) {
	h := newTelHarness(t, telRules)
	const n, size = 64, 1 << 20
	run := func(i int) {
		note := strings.Repeat(string(rune('a'+(i+26)%26)), size) + strconv.Itoa(i)
		ctx := tagging.With(context.Background(), "app", "web", "note", note)
		if _, err := h.db.ExecContext(ctx, "SELECT 1 FROM items WHERE id = $1", i); err != nil {
			t.Fatal(err)
		}
	}
	// The harness's fake connection keeps each statement's context: forget those, keep the spans.
	forgetContexts := func() {
		h.sent.mu.Lock()
		h.sent.texts, h.sent.ctxs = nil, nil
		h.sent.mu.Unlock()
	}
	run(-1)
	h.spans.Reset()
	grew := heapGrowth(n, run, forgetContexts)
	spans := h.spans.GetSpans()
	var cut int
	for _, s := range spans {
		for _, a := range s.Attributes {
			if a.Key == "pgtraffic.tag.note" {
				cut = max(cut, len(a.Value.AsString()))
			}
		}
	}
	if cut == 0 || cut > 256 {
		t.Fatalf("want the note tag cut to at most 256 bytes on the spans, longest %d", cut)
	}
	t.Logf("%d spans kept, tag attributes of at most %d bytes: heap +%d MiB after GC", len(spans), cut, grew>>20)
	if limit := int64(n * size / 4); grew > limit {
		t.Fatalf("%d spans whose note attribute is cut to %d bytes keep %d MiB alive: each pins its whole 1 MiB value",
			len(spans), cut, grew>>20)
	}
}

// heapGrowth is how much the live heap grew (bytes, after a GC) over run(0) ... run(n-1), with
// forget, which drops what the test itself keeps of them, called before each reading.
func heapGrowth(n int, run func(int), forget func()) int64 {
	var before, after runtime.MemStats
	forget()
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		run(i)
	}
	forget()
	runtime.GC()
	runtime.ReadMemStats(&after)
	return int64(after.HeapAlloc) - int64(before.HeapAlloc)
}
