package engine

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestReusedBufferText: query builders send text built with unsafe.String over a buffer they
// reuse, so two statements may share a data pointer and a length. The engine knows a text by its
// content only: an unqualified DELETE sent from the buffer that just held a SELECT of the same
// length is judged as a DELETE, and the require_where guard blocks it.
func TestReusedBufferText(t *testing.T) {
	e, clk := newEngine(t, `
guards:
  require_where: enforce
`)
	const sel, del = "SELECT * FROM t", "DELETE   FROM t"
	if len(sel) != len(del) {
		t.Fatal("the two texts must have the same length")
	}
	buf := []byte(sel)
	q := unsafe.String(&buf[0], len(buf))
	ctx := context.Background()
	for range 3 { // seen more than once, as a cached text would be
		if err := run(e, clk, ctx, q, time.Millisecond); err != nil {
			t.Fatalf("SELECT: %v", err)
		}
	}
	copy(buf, del) // the same storage now holds the DELETE
	_, err := begin(e, ctx, q)
	if d := denial(t, err); d.Reason != vocab.ReasonGuard || d.Rule != vocab.GuardRequireWhere {
		t.Fatalf("DELETE from the reused buffer: %+v, want a require_where block", d)
	}
	copy(buf, sel)
	if err := run(e, clk, ctx, q, time.Millisecond); err != nil {
		t.Fatalf("SELECT again: %v", err)
	}
}
