package driver

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestHugePerValuesAreNotKeptWhole: a budget `per: tenant` keeps a bucket and a
// concurrency count per tenant, up to 100,000 of them, kept after their statements end until the
// table needs room. Applications take the tenant from the request (a header, a JWT claim, a
// path segment), which a client chooses, up to net/http's 1 MB of headers. pgtraffic treats such
// a value as untrusted elsewhere: a Redis key of a shared budget's partition hashes a value
// over 128 bytes "so that a huge tag value cannot make huge keys", and telemetry cuts tag values
// to 256 bytes. The local key table keeps each value whole: 64 statements, each with its own
// 1 MiB tenant value, leave 64 MiB pinned after every statement has ended and its context is
// gone, and 100,000 such requests would pin 100 GB. A key's memory should be bounded (cut or
// hashed as the Redis field is), so that what the table holds is bounded by its 100,000 keys.
func TestHugePerValuesAreNotKeptWhole(t *testing.T) {
	h := newTelHarness(t, `
budgets:
  - name: tenants
    mode: enforce
    per: tenant
    max_concurrent: 4
rules:
  - budget: tenants
    match: {app: web}
`)
	const n, size = 64, 1 << 20
	run := func(i int) {
		tenant := strings.Repeat(string(rune('a'+i%26)), size) + strconv.Itoa(i)
		ctx := tagging.With(context.Background(), "app", "web", "tenant", tenant)
		if _, err := h.db.ExecContext(ctx, "SELECT 1 FROM items WHERE id = $1", i); err != nil {
			t.Fatal(err)
		}
	}
	// The harness keeps each statement's context (its fake connection) and span: forget
	// them, so that only what pgtraffic itself keeps is measured.
	forget := func() {
		h.spans.Reset()
		h.sent.mu.Lock()
		h.sent.texts, h.sent.ctxs = nil, nil
		h.sent.mu.Unlock()
	}
	run(-1) // warm up the pattern cache and the pool
	grew := heapGrowth(n, run, forget)
	var keys int
	for _, b := range h.conn.Snapshot().Budgets {
		if b.Name == "tenants" {
			keys = b.Keys
		}
	}
	t.Logf("%d statements with a 1 MiB tenant each: %d keys, heap +%d MiB after GC", n, keys, grew>>20)
	if limit := int64(n * size / 4); grew > limit {
		t.Fatalf("the heap grew by %d MiB after %d finished statements with a 1 MiB tenant each (%d keys kept): "+
			"the per-tenant table keeps each value whole", grew>>20, n, keys)
	}
}
