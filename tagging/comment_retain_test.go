package tagging

import (
	"runtime"
	"strings"
	"testing"
)

// TestParseKeepsNoCommentAlive: the tags Parse returns hold only their own bytes. A statement's
// comment may be a megabyte (padding, a pair too long to keep) beside a short tenant tag, and a
// tag is kept long after its statement: as a budget's key per tenant (up to 100,000 of them), as
// a span's attribute in an exporter's queue. Sliced from a buffer the size of the comment, each
// kept tag kept the whole comment alive.
func TestParseKeepsNoCommentAlive(t *testing.T) {
	const n, size = 40, 1 << 20
	pad := strings.Repeat("x", size)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := make([]Tags, n)
	for i := range kept {
		// The padding in a pair too long to keep, and one in a malformed pair, around the tenant.
		sql := "select 1 /*route='" + pad + "',tenant='t" + string(rune('a'+i%26)) + "',junk" + pad + "*/"
		kept[i] = Parse(sql)
		if v, ok := kept[i].Get("tenant"); !ok || len(v) != 2 {
			t.Fatalf("tenant = %q, %v", v, ok)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grew := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n*size)
	t.Logf("heap grew %.3f× one padding per statement while %d parsed tags are kept", grew, n)
	if grew > 0.1 {
		t.Errorf("keeping %d statements' tags kept %.2f× their comments' padding alive", n, grew)
	}
	runtime.KeepAlive(kept)
}

// TestAppendLeavesOutLongPairs: a context tag holding a request header or a document (100 KiB)
// is not copied into every statement sent (WithSQLCommenter): Append writes only the pairs
// Parse reads back, and leaves the statement alone when none is left.
func TestAppendLeavesOutLongPairs(t *testing.T) {
	long := strings.Repeat("h", 100<<10)
	out := Append("select 1", New("header", long, "tenant", "a"))
	if out != "select 1 /*tenant='a'*/" {
		t.Errorf("Append with a 100 KiB value beside a short one = %d bytes %.60q…", len(out), out)
	}
	if out := Append("select 1", New("header", long)); out != "select 1" {
		t.Errorf("Append with only a 100 KiB value = %d bytes, want the statement unchanged", len(out))
	}
}
