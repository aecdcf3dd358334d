package coord

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// FuzzDecodeReply: the sync script's reply, of any shape and content, is refused or read
// into exactly one result per partition; a stale reply is errStale and nothing else; every
// number of a result is the float64 the script packed (or its count), and once clamped lies
// within the budget's limits, whatever bytes Redis sent.
func FuzzDecodeReply(f *testing.F) {
	good := packResults([]float64{0.5, 1, 2, 3, 0.25, 0.5, 2, 1500, 1, 2, 4, 1, 0.125})
	forged := packResults([]float64{math.NaN(), math.Inf(1), math.Inf(1), math.NaN(), math.Inf(1), math.NaN(),
		math.Inf(-1), math.Inf(1), math.NaN(), math.Inf(1), math.Inf(1), math.NaN(), math.Inf(1)})
	for _, s := range []struct {
		shape uint8
		now   string
		stale int64
		blob  string
		n     uint8
	}{
		{3, "1733400000000000", 0, good, 1},
		{3, "7", 1, "", 0}, // stale
		{2, "7", 1, "", 0},
		{2, "7", 0, "", 0},
		{3, "7", 0, forged, 1},
		{3, "7", 0, good + good, 2},
		{3, "7", 0, good[:len(good)-1], 1},
		{3, "7", 0, "", 0},
		{3, "NaN", 0, good, 1},
		{3, "-Inf", 0, good, 1},
		{3, "1e300", 0, good, 1},
		{3, "0x1p-2", 0, good, 1},
		{3, "", 0, good, 1},
		{0x13, "7", 0, good, 1}, // with quarantines
		{0x23, "7", 0, good, 1}, // v[2] not a string
		{0x43, "7", 0, good, 1}, // now as an integer
		{5, "7", 0, good, 1},
		{0, "", 0, "", 0},
	} {
		f.Add(s.shape, s.now, s.stale, s.blob, s.n, 1.5, 3.0, uint16(4), int64(2500))
	}
	f.Fuzz(func(t *testing.T, shape uint8, now string, stale int64, blob string, n uint8,
		rate, burst float64, slots uint16, leaseMs int64) {
		// shape: the low 3 bits the count of values; 0x10 the quarantine list; 0x20 the
		// results not as a string; 0x40 the time as an integer; 0x80 the stale flag as a string.
		v := make([]any, 0, 8)
		var nowV any = now
		if shape&0x40 != 0 {
			nowV = int64(len(now)) * stale
		}
		var staleV any = stale
		if shape&0x80 != 0 {
			staleV = now
		}
		var blobV any = blob
		if shape&0x20 != 0 {
			blobV = []any{blob}
		}
		q := &QuarantineSpec{After: 1, For: 10 * time.Second}
		if shape&0x10 == 0 {
			q = nil
		}
		for i, x := range []any{nowV, staleV, blobV, []any{vocab.FingerprintHex(1), int64(5e6)}, blob} {
			if i < int(shape&7) {
				v = append(v, x)
			}
		}
		r, err := decodeReply(v, int(n), q)
		switch {
		case errors.Is(err, errStale):
			if len(v) < 2 || v[1] != int64(1) || r.results != nil || r.quarantines != nil {
				t.Fatalf("stale for %v: %+v", v, r)
			}
			return
		case err != nil:
			// The time may be read (the loop keeps Redis's clock even from a reply it
			// refuses), but no result.
			if r.results != nil {
				t.Fatalf("refused (%v) with %+v", err, r)
			}
			if len(err.Error()) > 200 {
				t.Fatalf("an error of %d bytes", len(err.Error()))
			}
			return
		}
		want := 3
		if q != nil {
			want = 4
		}
		if len(v) != want || v[1] == int64(1) || len(r.results) != int(n) || len(blob) != int(n)*resultFields*8 {
			t.Fatalf("accepted %d values for %d partitions (quarantines: %t): %d results", len(v), n, q != nil, len(r.results))
		}
		if q == nil && (r.quarantines != nil || r.ignored != 0) || len(r.quarantines) > MaxQuarantines {
			t.Fatalf("quarantines %v, ignored %d", r.quarantines, r.ignored)
		}
		// Each number is the float64 packed, or its count.
		for i, res := range r.results {
			num := func(j int) float64 {
				off := (i*resultFields + j) * 8
				return math.Float64frombits(binary.LittleEndian.Uint64([]byte(blob[off : off+8])))
			}
			same := func(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }
			if !same(res.lease.Rate, num(0)) || !same(res.lease.Burst, num(1)) || res.lease.Slots != count(num(2)) ||
				res.live != count(num(3)) || !same(res.debt, num(4)) || !same(res.target, num(5)) ||
				res.targetSlots != count(num(6)) || res.retake != time.Duration(count(num(7)))*time.Microsecond ||
				!same(res.inForce.Rate, num(8)) || !same(res.inForce.Burst, num(9)) ||
				res.inForce.MaxConcurrent != count(num(10)) || res.differ != (num(11) == 1) || !same(res.hold, num(12)) {
				t.Fatalf("result %d read as %+v", i, res)
			}
		}
		// Clamped, every number is one the script could have sent for the budget.
		spec := Spec{Rate: fuzzLimit(rate), Burst: fuzzLimit(burst), MaxConcurrent: int(slots)}
		lease := time.Duration(leaseMs%1e6) * time.Millisecond
		if lease < 0 {
			lease = -lease
		}
		for i := range r.results {
			res := &r.results[i]
			res.clamp(spec, lease)
			for _, x := range []struct {
				v, hi float64
			}{
				{res.lease.Rate, spec.Rate}, {res.lease.Burst, spec.Burst}, {res.debt, spec.Rate * maxDebtSeconds},
				{res.target, spec.Rate}, {res.inForce.Rate, spec.Rate}, {res.inForce.Burst, spec.Burst}, {res.hold, spec.Burst},
			} {
				if !(x.v >= 0 && x.v <= x.hi) {
					t.Fatalf("clamped for %+v: %+v", spec, *res)
				}
			}
			for _, x := range []int{res.lease.Slots, res.targetSlots, res.inForce.MaxConcurrent} {
				if x < 0 || x > spec.MaxConcurrent {
					t.Fatalf("clamped for %+v: %+v", spec, *res)
				}
			}
			if res.live < 0 || res.live > maxLive || res.retake < 0 || res.retake > lease {
				t.Fatalf("clamped for %+v, lease %v: %+v", spec, lease, *res)
			}
		}
	})
}

// fuzzLimit is x as a budget's rate or burst: finite and positive.
func fuzzLimit(x float64) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) || x <= 0 {
		return 1
	}
	return x
}
