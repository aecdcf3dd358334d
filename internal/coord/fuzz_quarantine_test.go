package coord

import (
	"encoding/binary"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// FuzzDecodeQuarantines: the script's list of quarantines, whatever Redis put in it, reads
// into at most MaxQuarantines entries, each with a time left in (0, for:]; every entry is
// either taken or counted as ignored (an odd last one too); an entry as the script writes
// it (16 hex digits, a positive µs count) reads back as written, cut to for:.
func FuzzDecodeQuarantines(f *testing.F) {
	f.Add([]byte{}, int64(10_000_000), uint16(0), uint8(0))
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, int64(10_000_000), uint16(3), uint8(0))
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff\xff\xff\xff\xff"), int64(1), uint16(1), uint8(0))
	f.Add([]byte("0123456789ABCDEF-5NaN+Inf1e308 0x1p3"), int64(3_600_000_000), uint16(2), uint8(1))
	f.Add([]byte("fffffffffffffffff"), int64(0), uint16(MaxQuarantines+3), uint8(2))
	f.Add([]byte("\x01\x02\x03"), int64(-5), uint16(4), uint8(3))
	f.Fuzz(func(t *testing.T, data []byte, forUs int64, valid uint16, shape uint8) {
		q := QuarantineSpec{After: 1, For: time.Duration(forUs%(24*3600e6)) * time.Microsecond}
		if q.For <= 0 {
			q.For = time.Microsecond - q.For
		}
		// A list of what Redis may hold: entries read from data, each a fingerprint of any
		// type and text and a time left of any type and value.
		list := make([]any, 0, 2*int(valid)+len(data))
		var wantFP []uint64
		var wantLeft []int64
		for i := range int(valid) % (MaxQuarantines + 10) {
			fp := uint64(i) * 0x9e3779b97f4a7c15
			left := int64(1 + uint64(i)*7919%uint64(2*q.For.Microseconds()))
			list = append(list, vocab.FingerprintHex(fp), left)
			wantFP, wantLeft = append(wantFP, fp), append(wantLeft, left)
		}
		for i := 0; i < len(data); {
			kind := data[i]
			i++
			var x any
			switch kind % 5 {
			case 0: // a string of the next bytes, up to 17
				end := min(i+int(kind/5%18), len(data))
				x = string(data[i:end])
				i = end
			case 1: // an integer
				var b [8]byte
				i += copy(b[:], data[i:])
				x = int64(binary.LittleEndian.Uint64(b[:]))
			case 2: // a number as a string, as Lua writes it
				var b [8]byte
				i += copy(b[:], data[i:])
				x = strconv.FormatFloat(math.Float64frombits(binary.LittleEndian.Uint64(b[:])), 'g', 17, 64)
			case 3: // a fingerprint, as the script writes it
				var b [8]byte
				i += copy(b[:], data[i:])
				x = vocab.FingerprintHex(binary.LittleEndian.Uint64(b[:]))
			default: // what Redis never returns in a list
				x = []any{kind}
			}
			list = append(list, x)
		}
		var v any = list
		if shape%4 == 3 {
			v = string(data) // no list at all
		}
		out, ignored := decodeQuarantines(v, q)
		if shape%4 == 3 {
			if out != nil || ignored != 1 {
				t.Fatalf("no list read as %v, ignored %d", out, ignored)
			}
			return
		}
		if len(out) > MaxQuarantines {
			t.Fatalf("%d quarantines", len(out))
		}
		if len(out)+ignored != (len(list)+1)/2 || ignored < 0 {
			t.Fatalf("%d entries: %d read, %d ignored", (len(list)+1)/2, len(out), ignored)
		}
		for _, l := range out {
			if l.left <= 0 || l.left > q.For {
				t.Fatalf("a quarantine with %v left, for: %v", l.left, q.For)
			}
		}
		// The entries as the script writes them come first: read back as written.
		for i := range min(len(wantFP), MaxQuarantines) {
			want := leftFor{wantFP[i], min(time.Duration(wantLeft[i])*time.Microsecond, q.For)}
			if out[i] != want {
				t.Fatalf("entry %d read as %+v, want %+v", i, out[i], want)
			}
		}
		// Whatever the fingerprint, its text as the script writes it reads back as it.
		for _, x := range list {
			if s, ok := x.(string); ok {
				if fp, ok := parseFingerprint(s); ok && vocab.FingerprintHex(fp) != s {
					t.Fatalf("fingerprint %q read as %x", s, fp)
				}
			}
		}
	})
}
