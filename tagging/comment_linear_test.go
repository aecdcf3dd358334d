package tagging

import (
	"strings"
	"testing"
	"time"
)

// TestParseCommaFloodIsLinear: Parse's comment is untrusted input; a comment of
// commas before a single '=' must cost time in proportion to its length, as a comment of any
// other shape does (scanPair once rescanned from each comma to the '=').
func TestParseCommaFloodIsLinear(t *testing.T) {
	const n = 128 << 10 // 128 KiB of commas
	flood := "select 1 /*" + strings.Repeat(",", n) + "=*/"
	plain := "select 1 /*" + strings.Repeat("a", n) + "=*/" // same length, one malformed pair
	timeIt := func(s string) time.Duration {
		best := time.Duration(1<<63 - 1)
		for range 1 {
			start := time.Now()
			Parse(s)
			best = min(best, time.Since(start))
		}
		return best
	}
	tp, tf := timeIt(plain), timeIt(flood)
	t.Logf("plain %v, comma flood %v", tp, tf)
	if tf > 20*time.Millisecond && tf > 100*tp {
		t.Fatalf("Parse of a %d-byte comment of commas took %v (%v for a same-length comment of letters): quadratic in the comment's length", n, tf, tp)
	}
}
