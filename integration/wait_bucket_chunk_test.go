package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestWaitPassesOnlyWhenTheChunkFits: the README's Quick start says "Retry after
// its RetryAfter ... Batch jobs call Connector.Wait(ctx) before each chunk instead"; Wait "blocks
// until Check passes", and Check "reports whether a statement carrying ctx's tags would be
// admitted now by the enforce budgets those tags select (health thresholds, zero limits,
// concurrency and bucket room ...)". A batch job under a server_share budget does exactly that:
// Wait, then its chunk (the same statement each time, its cost learned). Once the bucket is
// nearly full, Wait must wait for room for a chunk, not pass on a little room (asking the
// bucket for a nominal millisecond) and leave the chunk refused for the bucket: the job's loop
// would spin through Wait and refusals instead of waiting.
func TestWaitPassesOnlyWhenTheChunkFits(t *testing.T) {
	for _, fe := range openFrontEnds(t, `
server_cores: 1
budgets:
  - {name: b, mode: enforce, server_share: 0.2, burst_limit: 300ms}
rules:
  - {budget: b, match: {job: import}}
`, 4) {
		t.Run(fe.name, func(t *testing.T) {
			ctx := tagging.With(context.Background(), "job", "import")
			var ok, refused int
			var first *driver.BlockedError
			for range 12 {
				if err := fe.wait(ctx); err != nil {
					t.Fatal(err)
				}
				err := fe.exec(ctx, "select pg_sleep(0.1)") // the chunk
				var be *driver.BlockedError
				switch {
				case errors.As(err, &be):
					refused++
					if first == nil {
						first = be
					}
				case err != nil:
					t.Fatal(err)
				default:
					ok++
				}
			}
			t.Logf("%s: 12 chunks, each after Wait returned nil: %d ran, %d refused (first: %v)", fe.name, ok, refused, first)
			if refused > 0 {
				t.Errorf("%d of 12 chunks were refused right after Wait passed (%v): Wait/Check said a statement "+
					"with these tags would be admitted now", refused, first)
			}
		})
	}
}
