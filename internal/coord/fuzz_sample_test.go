package coord

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/health"
)

// fuzzEncodeSample is a sample as Publish writes it: its data, to be dated by the caller.
func fuzzEncodeSample(tb testing.TB, readings []health.Shared) string {
	tb.Helper()
	w := wireSample{Format: sampleFormat, Readings: make([]wireReading, len(readings))}
	for i, r := range readings {
		w.Readings[i] = wireReading{Metric: r.Metric, Age: r.Age.Microseconds(), Err: bounded.Cut(r.Err, maxSampleText)}
		if r.Err == "" {
			w.Readings[i].Value = strconv.FormatFloat(r.Value, 'g', -1, 64)
		}
	}
	data, err := json.Marshal(w)
	if err != nil {
		tb.Fatal(err)
	}
	return string(data)
}

// fuzzSampleBad is every reason decodeSample gives, but the format's, which names numbers.
var fuzzSampleBad = map[string]bool{
	"unreadable date": true, "dated in the future": true, "too large": true, "not a sample": true,
	"too many readings": true, "a reading too long": true, "a reading dated in the future or absurdly old": true,
	"an unreadable value": true,
}

// FuzzDecodeSample: a sample read from Redis, whatever its date and data, is either refused
// with one of a few fixed reasons (never its own text) and no readings, or accepted with
// readings within the bounds: at most health.MaxSharedReadings, short texts, ages neither
// negative nor beyond twice maxSampleAge, and no value beside an error. A sample written as
// Publish writes it, dated within maxSampleAge, reads back as written.
func FuzzDecodeSample(f *testing.F) {
	good := `{"f":1,"r":[{"m":"pg_stat_activity","v":"0.25","a":1500},{"m":"x","a":0,"e":"timeout"}]}`
	for _, s := range []struct {
		now  int64
		at   string
		data string
	}{
		{2_000_000, "1000000", good},
		{2_000_000, "2000001", good}, // in the future
		{2_000_000, "-1", good},
		{2_000_000, "", good},
		{2_000_000, "1e6", good},
		{2_000_000, "0x10", good},
		{math.MaxInt64, "0", good}, // elapsed µs beyond any Duration
		{math.MaxInt64, "1", `{"f":1,"r":[]}`},
		{0, "0", `{"f":1,"r":null}`},
		{1, "0", `{"f":2,"r":[]}`},
		{1, "0", `{"f":1.0,"r":[]}`},
		{1, "0", `{"f":1,"r":[{"m":"x","v":"NaN","a":0},{"m":"y","v":"-Inf","a":3600000000}]}`},
		{1, "0", `{"f":1,"r":[{"m":"x","v":"","a":0}]}`},
		{1, "0", `{"f":1,"r":[{"m":"x","v":"1","a":-1}]}`},
		{1, "0", `{"f":1,"r":[{"m":"x","v":"1","a":3600000001}]}`},
		{1, "0", `{"f":1,"r":[{"m":"x","v":"1","a":1e3}]}`},
		{1, "0", `{"f":1,"f":1,"r":[],"r":[{}]}`},
		{1, "0", `{"f":1,"r":[{"m":"` + strings.Repeat("a", maxSampleText+1) + `","v":"1","a":0}]}`},
		{1, "0", "not json"},
		{1, "0", ""},
		{1, "0", "[]"},
		{1, "0", "null"},
	} {
		f.Add(s.now, s.at, s.data, "m", 0.5, "", int64(1500), int64(250))
	}
	f.Add(int64(5e12), "4999999000000", good, "metric\xff", math.Inf(-1), "", int64(0), int64(0))
	f.Add(int64(5e12), "4999999000000", good, "", math.NaN(), "err\x00"+strings.Repeat("é", 600), int64(3_600_000_000), int64(3_600_000_000))
	f.Fuzz(func(t *testing.T, now int64, at, data, metric string, value float64, errText string, age, since int64) {
		readings, bad := decodeSample(now, at, data)
		checkSample(t, now, at, data, readings, bad)

		// The round trip: a sample as Publish writes it, of one reading dated age µs before
		// its publication, published since µs before now.
		if now < 0 {
			now = -(now + 1)
		}
		maxAge := maxSampleAge.Microseconds()
		age = fuzzWithin(age, maxAge)
		since = min(fuzzWithin(since, maxAge), now)
		want := health.Shared{Metric: metric, Value: value, Age: time.Duration(age) * time.Microsecond, Err: errText}
		data = fuzzEncodeSample(t, []health.Shared{want})
		at = strconv.FormatInt(now-since, 10)
		readings, bad = decodeSample(now, at, data)
		checkSample(t, now, at, data, readings, bad)
		// JSON writes invalid UTF-8 as U+FFFD, which may lengthen the name past the bound.
		var sent string
		if b, err := json.Marshal(metric); err != nil || json.Unmarshal(b, &sent) != nil {
			t.Fatalf("metric %q does not cross JSON", metric)
		}
		switch {
		case len(data) > maxSampleBytes || len(sent) > maxSampleText:
			if bad == "" {
				t.Fatalf("a sample beyond the bounds was accepted: metric of %d bytes, data of %d", len(sent), len(data))
			}
			return
		case bad != "":
			t.Fatalf("a sample as Publish writes it, dated %s at %d, was refused: %s: %q", at, now, bad, data)
		case len(readings) != 1:
			t.Fatalf("%d readings, want 1", len(readings))
		}
		want.Age += time.Duration(since) * time.Microsecond
		want.Err = bounded.Cut(errText, maxSampleText)
		if want.Err != "" {
			want.Value = 0
		}
		if utf8.ValidString(metric) && sent != metric {
			t.Fatalf("metric %q crosses JSON as %q", metric, sent)
		}
		want.Metric = sent
		got := readings[0]
		if math.IsNaN(want.Value) && math.IsNaN(got.Value) {
			got.Value, want.Value = 0, 0 // NaN equals nothing
		}
		if got != want {
			t.Fatalf("read back %+v, want %+v", readings[0], want)
		}
	})
}

// fuzzWithin maps x onto [0, hi].
func fuzzWithin(x, hi int64) int64 {
	if x < 0 {
		x = -(x + 1)
	}
	return x % (hi + 1)
}

// checkSample asserts what holds of any decodeSample result.
func checkSample(t *testing.T, now int64, at, data string, readings []health.Shared, bad string) {
	t.Helper()
	if bad != "" {
		if readings != nil {
			t.Fatalf("refused (%s) with %d readings", bad, len(readings))
		}
		if !fuzzSampleBad[bad] && !strings.HasPrefix(bad, "format ") || len(bad) > 64 {
			t.Fatalf("an unexpected reason %q", bad)
		}
		return
	}
	if published, err := strconv.ParseInt(at, 10, 64); err != nil || published < 0 || published > now {
		t.Fatalf("accepted a sample dated %q at %d", at, now)
	}
	if len(data) > maxSampleBytes {
		t.Fatalf("accepted a sample of %d bytes", len(data))
	}
	if readings == nil || len(readings) > health.MaxSharedReadings {
		t.Fatalf("accepted with %d readings (nil: %t)", len(readings), readings == nil)
	}
	for _, r := range readings {
		if len(r.Metric) > maxSampleText || len(r.Err) > maxSampleText {
			t.Fatalf("accepted a reading of %d+%d bytes", len(r.Metric), len(r.Err))
		}
		if r.Age < 0 || r.Age > 2*maxSampleAge {
			t.Fatalf("accepted a reading aged %v (sample dated %s at %d)", r.Age, at, now)
		}
		if r.Err != "" && r.Value != 0 {
			t.Fatalf("accepted a reading with both an error and a value: %+v", r)
		}
	}
}
