package coord

import (
	"fmt"
	"regexp"
	"strconv"
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

// TestSyncScriptWantChannel: the channel sync.lua publishes on, which it names from the key of
// the budget's partitions (KEYS[1]), is the budget's WantChannel, the one each coordinator
// listens on.
func TestSyncScriptWantChannel(t *testing.T) {
	m := regexp.MustCompile(`local want_channel = sub\(hkey, 1, -(\d+)\) \.\. '([^']*)'`).FindStringSubmatch(syncSource)
	if m == nil {
		t.Fatal("sync.lua no longer names its want channel as this test reads it")
	}
	drop, _ := strconv.Atoi(m[1]) // string.sub(s, 1, -n) leaves out the last n-1 bytes
	for _, name := range []string{"orders", "{a}%b"} {
		hkey := PartitionsKey("", name)
		if drop < 1 || drop-1 > len(hkey) {
			t.Fatalf("sync.lua cuts %d bytes off %q", drop-1, hkey)
		}
		if got, want := hkey[:len(hkey)-(drop-1)]+m[2], WantChannel("", name); got != want {
			t.Errorf("budget %q: sync.lua publishes on %q, the coordinators listen on %q", name, got, want)
		}
	}
}

// TestSyncScriptBoundsMatchReplies: the bounds the client puts on a reply (clamp) are the ones
// the script keeps: the global debt it holds (max_debt, µs of the rate) and the instances it
// may count (max_lost). A script that kept more would have its replies cut short; one that
// kept less would let a forged reply claim more than the script can send.
func TestSyncScriptBoundsMatchReplies(t *testing.T) {
	for _, want := range []string{
		fmt.Sprintf("local max_debt = %d * 1000000", maxDebtSeconds),
		fmt.Sprintf("local max_lost = %d", maxLive),
	} {
		if !strings.Contains(syncSource, want) {
			t.Errorf("sync.lua does not hold %q", want)
		}
	}
}
