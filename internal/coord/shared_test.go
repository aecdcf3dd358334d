package coord

import (
	"encoding/json"
	"testing"
	"time"
)

// These tests steer the real local budget (internal/budget) through coordinators on a real
// redis-server, as the engine wires them, in virtual time (simulateSlots). That one instance
// alone under a shared max_concurrent serves a burst of its workers at once is
// TestAloneSlotsRefuseNothingBelowTheLimit.

// TestForgedRedisStateIsChecked: whatever else is written into a shared budget's partition (an
// instance entry with negative numbers, one that expires in 2255, inf and nan in the
// partition's state, an entry cut short, an id longer than the value, an entry that is not an
// instance's, a value too short for a partition or that expires at nan or in 2255), rewritten
// before every sync, the budget never runs more than max_concurrent at once nor admits more
// than its rate and burst, its statements still run, and nothing non-finite reaches the
// status.
// randomBytes defines, for a forge script, bytes(n): n bytes from a generator (Park and
// Miller's) seeded by the simulation's time, and x, its state.
const randomBytes = `local x = tonumber(ARGV[1]) % 2147483646 + 1
local function bytes(n)
  local t = {}
  for i = 1, n do
    x = (x * 48271) % 2147483647
    t[i] = string.char(x % 256)
  end
  return table.concat(t)
end
`

func TestForgedRedisStateIsChecked(t *testing.T) {
	const now = "local now = tonumber(ARGV[1])\n"
	for _, tc := range []struct{ name, script string }{
		{"negative numbers", now + "hset('i:forged', {1, -100, -100, -8, -10, now + 400000, 0})"},
		{"expiry in 2255", now + "hset('i:forged', {1, 1, 2, 2, 1, 8.9e15, 0})"},
		{"inf and nan", "hset('tat', 1/0, 'last', 0/0, 'lu', 1/0, 'ln', 0/0, 'i:junk', 'cut short', 'gf', -1/0)"},
		{"nan tat", "hset('tat', 0/0, 'ln', 1e308, 'lu', -1/0)"},
		{"an entry cut short first", now + "table.insert(st, 7, 'i:short') table.insert(st, 8, 'abc')"},
		{"an id longer than the value", "raw = struct.pack('<ddddddd', lapse, 0, 0, 0, 0, 0, 0) .. struct.pack('<H', 65535) .. 'i:x' .. string.rep('x', 200)"},
		{"not an instance", now + "hset(7, {1, 1, 2, 2, 1, now + 400000, 0}, 'x:forged', {1, 1, 2, 2, 1, now + 400000, 0})"},
		{"too short for a partition", "raw = 'not a partition'"},
		{"partition expiry nan", "lapse = 0/0"},
		{"partition expiry in 2255", "lapse = 8.9e15"},
		{"header cut short", "raw = struct.pack('<dd', lapse, 5)"},
		// Bytes drawn anew before every sync (a generator seeded by the simulation's time):
		// random numbers in the header and in instances' entries, and a random tail.
		{"random entries", randomBytes + "raw = struct.pack('<d', lapse) .. bytes(48) .. " +
			"struct.pack('<H', 4) .. 'i:r1' .. bytes(96) .. struct.pack('<H', 4) .. 'i:r2' .. bytes(96)"},
		{"random tail", randomBytes + "raw = struct.pack('<d', lapse) .. bytes(48) .. bytes(x % 300)"},
		{"random instance", randomBytes + now + "bytes(1) hset('i:r', {x % 100, x % 1000 / 100 - 1, x % 7 - 1, x % 5 - 1, " +
			"x % 9 / 10 - 0.1, now + x % 800000 - 200000, 0, x % 6, x % 11 / 10, x % 13 / 10, x % 17 / 10 - 0.5, now - x % 3000000})"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const interval = 200 * time.Millisecond
			cfg := slotConfig{name: "forged-" + tc.name, instances: 1, limit: 2, rate: 0.5, burst: 0.25, cost: 0.005,
				interval: interval, stmt: 5 * time.Millisecond, duration: 10 * interval, seed: 1,
				workers: func(int, time.Duration) int { return 8 }, forge: tc.script}
			r := simulateSlots(t, cfg)
			from := 2 * interval
			admitted, most := r.after(from)
			// Everything admitted after from, at cost each: at most the rate over the span
			// plus the burst.
			span := (cfg.duration - from).Seconds()
			got, limit := float64(admitted[0])*cfg.cost, cfg.rate*span+cfg.burst
			c, b := r.insts[0].c, r.insts[0].b
			t.Logf("%.3f execution seconds admitted in %.1f s (at most %.3f); at most %d in flight; %+v",
				got, span, limit, most, c.Status()[0])
			if most > cfg.limit {
				t.Errorf("%d statements in flight, max_concurrent is %d", most, cfg.limit)
			}
			if got > limit {
				t.Errorf("admitted %.3f execution seconds, the budget allows %.3f", got, limit)
			}
			if admitted[0] == 0 {
				t.Errorf("no statement ran")
			}
			if st := c.Status()[0]; st.Syncs < 3 {
				t.Errorf("%d syncs succeeded in 10 intervals, %d failed", st.Syncs, st.Failures)
			}
			if _, err := json.Marshal(c.Status()); err != nil {
				t.Errorf("status: %v", err)
			}
			if _, err := json.Marshal(b.Snapshot(r.end)); err != nil {
				t.Errorf("snapshot: %v", err)
			}
		})
	}
}

// TestRollingLimitChangeKeepsEvenShares: two instances share a budget while a change of its
// max_concurrent is half rolled out (6 on one, 2 on the other). Both enforce the smaller
// limit together, each keeps its even share of it (the instance on the lower limit is not
// shut out), and both show the disagreement.
func TestRollingLimitChangeKeepsEvenShares(t *testing.T) {
	const interval = 200 * time.Millisecond
	cfg := slotConfig{name: "rolling", instances: 2, limits: func(i int) int { return []int{6, 2}[i] },
		interval: interval, stmt: 5 * time.Millisecond, duration: 15 * interval, seed: 1,
		workers: func(int, time.Duration) int { return 8 }}
	r := simulateSlots(t, cfg)
	from := 3 * interval
	admitted, most := r.after(from)
	nHigh, nLow := admitted[0], admitted[1]
	t.Logf("admitted after %v: %d on the instance at 6, %d on the one at 2; at most %d in flight on both",
		from, nHigh, nLow, most)
	if most > 2 {
		t.Errorf("%d statements in flight on both instances; the smaller limit is 2", most)
	}
	if nLow*2 < nHigh || nHigh*2 < nLow {
		t.Errorf("uneven shares of the smaller limit: %d and %d statements", nHigh, nLow)
	}
	for _, in := range r.insts {
		st := in.c.Status()[0]
		if !st.LimitsDiffer || st.LimitsInForce.MaxConcurrent != 2 {
			t.Errorf("instance %s: status %+v, want the disagreement and max_concurrent 2 in force", in.c.Instance(), st)
		}
	}
}
