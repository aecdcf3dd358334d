package coord

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// A simulation in virtual time of instances sharing max_concurrent, as vsim_test.go's for a
// rate: real coordinators steering real budgets through a real redis-server running the
// sync script on the simulation's clock. Each instance runs a number of workers that changes
// over time (a ramp); a worker holds a slot for a statement's time and, refused, tries again
// a millisecond later. Every refusal is recorded with the fleet's statements in flight at
// that moment, so that the headroom's bound can be checked, and every admission with the
// fleet's statements in flight after it.

// slotConfig is one simulated ramp.
type slotConfig struct {
	name      string
	instances int
	limit     int // max_concurrent
	// limits, when not nil, is instance i's max_concurrent instead of limit: a change of
	// the limit rolled out to some instances only.
	limits func(i int) int
	// rate and burst are the budget's bucket (execution seconds per second, and seconds);
	// 0: none. cost is each statement's predicted and actual execution seconds.
	rate, burst, cost float64
	// forge, when not empty, is a script that another writer runs on the unkeyed partition
	// before each sync, between forgePrelude and forgePostlude: ARGV[1] is the simulation's
	// time in µs.
	forge    string
	interval time.Duration
	stmt     time.Duration // how long a statement holds its slot, and up to as much again at random
	duration time.Duration
	seed     uint64
	// workers is how many workers instance i runs at el.
	workers func(i int, el time.Duration) int
	// listen hands the messages of the budget's want channel to every instance, as a
	// started coordinator's listener does (at the end of the step whose sync sent them).
	listen bool
	// warn, when not nil, says instance i runs the budget in warn mode: a statement its budget
	// refuses runs anyway, over the limits as a would-be waiter where enforce would have it
	// wait (budget.TakeWaiter, max_wait a second), else holding nothing, as the engine runs
	// it.
	warn func(i int) bool
	// eager visits an instance's budget at every refusal, as its loop does on a kick, rather
	// than once a step: each visit takes the usage since the last, so a statement refused
	// and retried counts once as demand, and a report of demand covers the refusals since the
	// previous visit only (see "Slots with headroom" in doc.go).
	eager bool
}

// refusal is a statement refused for want of a slot.
type refusal struct {
	at       time.Duration
	instance int
	fleet    int // statements in flight on every instance at the refusal
	own      int // on the refused statement's instance
}

// admission is a statement admitted.
type admission struct {
	at       time.Duration
	instance int
	fleet    int // statements in flight on every instance after it
}

// slotResult is what a ramp admitted and refused, and the instances as the ramp left them.
type slotResult struct {
	admitted   int
	admissions []admission
	refusals   []refusal
	most       int             // the most statements in flight on the fleet at once
	messages   []time.Duration // when the want channel carried a message (with cfg.listen)
	insts      []*slotInst
	end        time.Time
}

// after returns the statements each instance admitted from from on, and the most in flight
// on the fleet that an admission from from on brought.
func (r slotResult) after(from time.Duration) (perInstance []int, most int) {
	perInstance = make([]int, len(r.insts))
	for _, a := range r.admissions {
		if a.at >= from {
			perInstance[a.instance]++
			most = max(most, a.fleet)
		}
	}
	return perInstance, most
}

type slotWorker struct {
	next    time.Time
	running bool
	held    bool // its statement holds req (a warned one runs holding nothing)
	req     budget.Request
}

type slotInst struct {
	driven
	b       *budget.Budget
	workers []slotWorker
	running int
}

// simulateSlots runs cfg in steps of a millisecond of virtual time. Each instance registers
// and syncs once before its workers start: a connector registers its budgets when it opens,
// and a budget without a per tag asks for its lease at once (core.keepUnkeyed).
func simulateSlots(t *testing.T, cfg slotConfig) slotResult {
	t.Helper()
	rc := simRedis(t)
	clk := fakeclock.New()
	cr := newClockedRedis(t, rc, clk.Now)
	if cfg.forge != "" {
		key, field := PartitionsKey("", cfg.name), partitionField("")
		script := forgePrelude + cfg.forge + forgePostlude
		cr.before = func(ctx context.Context, now time.Time) {
			if err := rc.Eval(ctx, script, []string{key}, now.UnixMicro(), field).Err(); err != nil && !errors.Is(err, redis.Nil) {
				t.Errorf("forging: %v", err)
			}
		}
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 1))
	ctx := context.Background()
	insts := make([]*slotInst, cfg.instances)
	for i := range insts {
		spec := Spec{Name: cfg.name, Rate: cfg.rate, Burst: cfg.burst, MaxConcurrent: cfg.limit,
			Warn: cfg.warn != nil && cfg.warn(i)}
		if cfg.limits != nil {
			spec.MaxConcurrent = cfg.limits(i)
		}
		r := rand.New(rand.NewPCG(cfg.seed, uint64(i)+2))
		c := newCoord(t, Options{Client: cr, Interval: cfg.interval, Instance: fmt.Sprintf("s%02d", i), Logger: quiet,
			Now: clk.Now, Rand: r.Float64})
		b := budget.New(budget.Spec{Rate: spec.Rate, Burst: spec.Burst, MaxConcurrent: spec.MaxConcurrent,
			MaxQueue: spec.MaxConcurrent})
		c.Register(spec, b)
		insts[i] = &slotInst{driven: driven{c: c}, b: b}
	}
	res := slotResult{insts: insts}
	start := clk.Now()
	var deliver func()
	if cfg.listen {
		deliver = wantListener(t, rc, cfg.name, insts, func() { res.messages = append(res.messages, clk.Now().Sub(start)) })
	}
	step := func(in *slotInst, now time.Time) {
		if in.step(ctx, now) && deliver != nil {
			deliver()
		}
	}
	for _, in := range insts {
		step(in, clk.Now())
	}
	fleet := 0
	for el := time.Duration(0); el < cfg.duration; el += time.Millisecond {
		if el > 0 {
			clk.Advance(time.Millisecond)
		}
		now := clk.Now()
		for i, in := range insts {
			for len(in.workers) < cfg.workers(i, el) {
				in.workers = append(in.workers, slotWorker{next: now})
			}
			for w := range in.workers {
				wk := &in.workers[w]
				for !wk.next.After(now) {
					if wk.running {
						if wk.held {
							budget.Release(now, &wk.req, cfg.cost)
						}
						wk.running = false
						in.running--
						fleet--
						if w >= cfg.workers(i, el) {
							wk.next = now.Add(time.Hour) // a worker of a ramp that went down stops
							break
						}
						continue // the next statement at once
					}
					if w >= cfg.workers(i, el) {
						wk.next = now.Add(time.Millisecond)
						break
					}
					reqs := []budget.Request{{Budget: in.b, Cost: cfg.cost}}
					held := true
					if _, d := budget.Admit(now, reqs, nil); d != nil && cfg.warn != nil && cfg.warn(i) {
						held = budget.TakeWaiter(now, &reqs[0], d, time.Second)
					} else if d != nil {
						res.refusals = append(res.refusals, refusal{at: el, instance: i, fleet: fleet, own: in.running})
						wk.next = now.Add(time.Millisecond)
						if cfg.eager {
							step(in, now)
						}
						continue
					}
					res.admitted++
					res.admissions = append(res.admissions, admission{at: el, instance: i, fleet: fleet + 1})
					wk.req, wk.running, wk.held = reqs[0], true, held
					in.running++
					fleet++
					res.most = max(res.most, fleet)
					wk.next = now.Add(cfg.stmt + time.Duration(rng.Float64()*float64(cfg.stmt)))
				}
			}
			step(in, now)
		}
	}
	res.end = clk.Now()
	return res
}

// wantListener subscribes to the want channel of budget name and returns a function that
// hands every message sent on it so far to each of insts, as their listeners would, calling
// sent for each: it publishes a
// marker of its own and reads up to it, so that what a step's syncs published is delivered
// before the next step, whatever Redis's pace.
func wantListener(t *testing.T, rc *redis.Client, name string, insts []*slotInst, sent func()) func() {
	t.Helper()
	ctx := context.Background()
	ch := WantChannel("", name)
	ps := rc.Subscribe(ctx, ch)
	t.Cleanup(func() { _ = ps.Close() })
	if _, err := ps.Receive(ctx); err != nil { // the subscription's confirmation
		t.Fatalf("subscribing to %s: %v", ch, err)
	}
	const marker = "sim:marker" // not a partition's field
	return func() {
		if err := rc.Publish(ctx, ch, marker).Err(); err != nil {
			t.Fatalf("publishing the marker: %v", err)
		}
		for {
			m, err := ps.ReceiveMessage(ctx)
			if err != nil {
				t.Fatalf("reading %s: %v", ch, err)
			}
			if m.Payload == marker {
				return
			}
			sent()
			for _, in := range insts {
				in.c.wanted(m.Channel, m.Payload)
			}
		}
	}
}

// TestAloneSlotsRefuseNothingBelowTheLimit is the headroom's guarantee for one instance: a
// shared max_concurrent of 64 refuses nothing that the same budget process-local would
// admit, however fast its demand rises (8, then 12, then 64 workers, then 70: only the
// statements beyond the 64th are refused, with 64 in flight).
func TestAloneSlotsRefuseNothingBelowTheLimit(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := slotConfig{name: fmt.Sprintf("alone-%d", seed), instances: 1, limit: 64, interval: time.Second,
				stmt: 5 * time.Millisecond, duration: 12 * time.Second, seed: seed,
				workers: func(_ int, el time.Duration) int {
					switch {
					case el < 3*time.Second:
						return 8
					case el < 6*time.Second:
						return 12
					case el < 9*time.Second:
						return 64
					}
					return 70
				}}
			r := simulateSlots(t, cfg)
			below := 0
			for _, x := range r.refusals {
				if x.own < cfg.limit {
					below++
				}
			}
			t.Logf("%d admitted, %d refused (%d with fewer than %d in flight); at most %d in flight",
				r.admitted, len(r.refusals), below, cfg.limit, r.most)
			if below > 0 {
				t.Errorf("%d statements refused with fewer than max_concurrent in flight on the only instance", below)
			}
			if r.most > cfg.limit {
				t.Errorf("%d in flight, max_concurrent %d", r.most, cfg.limit)
			}
			if len(r.refusals) == 0 {
				t.Errorf("70 workers under max_concurrent 64 were never refused")
			}
		})
	}
}

// TestSlotsHeadroomBound is the headroom's bound with several instances: four instances run 4
// workers each under max_concurrent 64 (demand 16, headroom 48, 12 each), then one of them
// jumps to 40 workers. Each instance holds its demand and a quarter of the headroom, so the
// jump is admitted at once up to its 16 slots; past them a statement is refused only while
// the fleet is within (instances − 1) × a quarter of the headroom of the limit, and the
// others' next syncs (within about an interval) hand over their headroom: the refusals end
// within their next regular syncs and two early syncs of the jumper. The fleet never runs
// more than 64.
//
// At the start the first instance to sync holds the whole budget until its next sync, which
// gives the others their share: their first statements are refused for up to about an
// interval (a joiner waits for the holders' next syncs and its own next early sync). None is refused after that until
// the jump.
func TestSlotsHeadroomBound(t *testing.T) {
	const jump = 5 * time.Second
	for seed := uint64(1); seed <= 3; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			cfg := slotConfig{name: fmt.Sprintf("bound-%d", seed), instances: 4, limit: 64, interval: time.Second,
				stmt: 5 * time.Millisecond, duration: 10 * time.Second, seed: seed,
				workers: func(i int, el time.Duration) int {
					if i == 0 && el >= jump {
						return 40
					}
					return 4
				}}
			r := simulateSlots(t, cfg)
			const demand, n = 16, 4
			share := (cfg.limit - demand) / n // each instance's headroom
			bound := cfg.limit - (n-1)*share  // the fleet in flight at the first possible refusal
			settled := time.Duration(0)       // when the start's handover ended
			between := 0                      // refused after it, before the jump
			first, last, least := time.Duration(-1), time.Duration(0), cfg.limit
			for _, x := range r.refusals {
				switch {
				case x.at < 2*cfg.interval:
					settled = max(settled, x.at)
				case x.at < jump:
					between++
				default:
					if first < 0 {
						first = x.at
					}
					last = x.at
					least = min(least, x.fleet)
				}
			}
			t.Logf("start: refusals until %v; %d refused after it before the jump; after the jump %v to %v, with at least %d in flight on the fleet (bound %d); at most %d in flight",
				settled, between, max(first-jump, 0), last-jump, least, bound, r.most)
			if between > 0 {
				t.Errorf("%d statements refused between the start's handover and the jump, the fleet's demand a quarter of the limit", between)
			}
			// A joiner waits at most for the holders' next regular syncs (within an interval:
			// the phase each draws at its first) and its own next early sync (an eighth of an
			// interval later), with a tenth to spare; after the jump, the jumper's early sync
			// that tells Redis its want comes first.
			if limit := 11*cfg.interval/10 + cfg.interval/8; settled > limit {
				t.Errorf("the joiners waited %v for their share, more than %v", settled, limit)
			}
			if least < bound {
				t.Errorf("a statement was refused with %d in flight on the fleet; the bound is %d", least, bound)
			}
			if limit := 11*cfg.interval/10 + 2*cfg.interval/8; first >= 0 && last-jump > limit {
				t.Errorf("refusals went on %v after the jump, more than %v", last-jump, limit)
			}
			if r.most > cfg.limit {
				t.Errorf("%d in flight, max_concurrent %d", r.most, cfg.limit)
			}
		})
	}
}

// forgePrelude reads the partition whose field is ARGV[2] in the hash KEYS[1] for a forge
// script, which changes it with hset(name, value, ...), as if the partition were a hash of the
// fields sync.lua names (tat, gf, gt, last, lu, ln, and "i:<id>" with an instance's entry: a
// table of up to twelve numbers, or a string written as the entry's bytes), or sets lapse,
// the partition's expiry, or raw, the field's whole value; forgePostlude writes it back in
// sync.lua's layout. A header value that is not a number is written as 0, an entry's value
// as NaN.
const forgePrelude = `local v = redis.call('HGET', KEYS[1], ARGV[2])
local lapse, st, raw = tonumber(ARGV[1]) + 10000000, {0, 0, 0, 0, 0, 0}, nil
if v and #v >= 56 then
  local h = {struct.unpack('<ddddddd', v)}
  lapse, st = h[1], {h[2], h[3], h[4], h[5], h[6], h[7]}
  local pos = 57
  while pos + 97 <= #v do
    local e = {struct.unpack('<Hc0dddddddddddd', v, pos)}
    pos = table.remove(e)
    st[#st + 1] = table.remove(e, 1)
    st[#st + 1] = e
  end
end
local pos = {tat = 1, gf = 2, gt = 3, last = 4, lu = 5, ln = 6}
local function hset(...)
  local a = {...}
  for k = 1, #a, 2 do
    local f, x = a[k], a[k + 1]
    if pos[f] then
      st[pos[f]] = x
    else
      local found = false
      for j = 7, #st, 2 do
        if st[j] == f then st[j + 1], found = x, true end
      end
      if not found then st[#st + 1], st[#st + 2] = f, x end
    end
  end
end
`

const forgePostlude = `
if not raw then
  local parts = {struct.pack('<d', lapse)}
  for k = 1, 6 do parts[#parts + 1] = struct.pack('<d', tonumber(st[k]) or 0) end
  for j = 7, #st, 2 do
    local f, e = tostring(st[j]), st[j + 1]
    parts[#parts + 1] = struct.pack('<H', #f) .. f
    if type(e) == 'table' then
      for k = 1, 12 do parts[#parts + 1] = struct.pack('<d', tonumber(e[k]) or 0/0) end
    else
      parts[#parts + 1] = tostring(e)
    end
  end
  raw = table.concat(parts)
end
redis.call('HSET', KEYS[1], ARGV[2], raw)
`

// TestWarnInstanceHoldsNoMoreThanItsLease is a shared budget moved from warn to enforce by a
// rolling deploy: one instance still on warn runs 16 workers under max_concurrent 8, its
// statements beyond its lease running anyway (as would-be waiters, or warned), while an
// instance already on enforce runs 4. The enforce instance must be served as if the other
// enforced too (each gets its max-min share, 4), not refused because the warn instance's
// statements beyond its lease count as held: its admissions after the first syncs are
// compared with the same run where both instances enforce.
func TestWarnInstanceHoldsNoMoreThanItsLease(t *testing.T) {
	run := func(name string, warn bool) int {
		cfg := slotConfig{name: name, instances: 2, limit: 8, interval: time.Second,
			stmt: 5 * time.Millisecond, duration: 10 * time.Second, seed: 1,
			workers: func(i int, el time.Duration) int {
				switch {
				case i == 0:
					return 16
				case el < 2*time.Second:
					return 0
				}
				return 4
			},
		}
		if warn {
			cfg.warn = func(i int) bool { return i == 0 }
		}
		perInstance, _ := simulateSlots(t, cfg).after(5 * time.Second)
		return perInstance[1]
	}
	enforced := run("warn-deploy-enforce", false)
	warned := run("warn-deploy-warn", true)
	if enforced == 0 {
		t.Fatalf("the enforce instance admitted nothing beside an enforcing one")
	}
	ratio := float64(warned) / float64(enforced)
	t.Logf("the enforce instance's admissions from 5s: %d beside a warn instance, %d beside an enforce one (%.2f)",
		warned, enforced, ratio)
	if ratio < 0.9 {
		t.Errorf("beside an instance still on warn the enforce instance admitted %.2f of what it admits beside one on enforce, want at least 0.9", ratio)
	}
}
