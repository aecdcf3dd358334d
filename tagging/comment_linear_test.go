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
	// The best of several runs of each, interleaved, so that a pause of a loaded machine
	// (scheduling, GC) during one run cannot pass for quadratic work: quadratic work is slow in
	// every run (a 128 KiB flood: seconds, where linear work takes a millisecond).
	tp, tf := time.Duration(1<<63-1), time.Duration(1<<63-1)
	for range 5 {
		for _, r := range []struct {
			s    string
			best *time.Duration
		}{{plain, &tp}, {flood, &tf}} {
			start := time.Now()
			Parse(r.s)
			*r.best = min(*r.best, time.Since(start))
		}
	}
	t.Logf("plain %v, comma flood %v", tp, tf)
	if tf > 20*time.Millisecond && tf > 100*tp {
		t.Fatalf("Parse of a %d-byte comment of commas took %v (%v for a same-length comment of letters): quadratic in the comment's length", n, tf, tp)
	}
}
