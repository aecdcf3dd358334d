package coord

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// TestSyncScriptLongestLease: the sync script's longest lease another instance may hold
// (max_ttl, for a rolling change of sync_interval) is the lease of the longest interval the
// rules allow, leaseDuration(rules.MaxSyncInterval): a script that took less would drop the
// entries of an instance on a longer interval, and hand its capacity out again.
func TestSyncScriptLongestLease(t *testing.T) {
	longest := leaseDuration(rules.MaxSyncInterval)
	want := fmt.Sprintf("local max_ttl = max(ttl, %d * 1000000)", longest/time.Second)
	if longest%time.Second != 0 || !strings.Contains(syncSource, want) {
		t.Fatalf("sync.lua does not hold %q (the lease of %v)", want, rules.MaxSyncInterval)
	}
}
