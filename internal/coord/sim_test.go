package coord

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// simBudget is a minimal local budget as the budget package is to implement [Local]: one
// partition, a reverse leaky bucket that enforces exactly its lease (draining at the lease's
// rate, holding at most its burst), the counters TakeUsage reports, and a kick when it
// refuses. Statements are instantaneous: their cost is charged at admission.
//
// The kick is called under the budget's lock: [Handle.Kick] never blocks nor calls back.
type simBudget struct {
	mu       sync.Mutex // protects the fields below
	lease    budget.Lease
	has      bool         // lease was set; else the partition is held to prov
	prov     budget.Lease // the provisional lease
	debt     float64
	at       time.Time
	offered  float64
	used     float64
	starved  bool
	admitted map[int64]float64 // admitted cost per 100 ms bucket
	kick     func()
	history  []string // lease changes, for a failure's log
}

// drain drains the debt up to now; a time before the last one seen drains nothing.
func (b *simBudget) drain(now time.Time) {
	if b.at.IsZero() || now.After(b.at) {
		if !b.at.IsZero() {
			b.debt = max(0, b.debt-b.inForce().Rate*now.Sub(b.at).Seconds())
		}
		b.at = now
	}
}

// inForce is the lease the partition is held to: its own, else the provisional one.
func (b *simBudget) inForce() budget.Lease {
	if b.has {
		return b.lease
	}
	return b.prov
}

func (b *simBudget) admit(now time.Time, cost float64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drain(now)
	b.offered += cost
	// A partition with no debt admits one statement larger than its lease's burst.
	if l := b.inForce(); l.Rate == 0 || b.debt+cost > l.Burst && b.debt > 0 {
		b.starved = true
		if b.kick != nil {
			b.kick()
		}
		return false
	}
	if !b.has && b.kick != nil {
		b.kick() // admitted on the provisional lease: its own is to come early
	}
	b.debt += cost
	b.used += cost
	b.admitted[now.UnixNano()/int64(100*time.Millisecond)] += cost
	return true
}

func (b *simBudget) TakeUsage(_ time.Time, dst []budget.Usage) []budget.Usage {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := budget.Usage{Offered: b.offered, Used: b.used, Starved: b.starved, Provisional: !b.has}
	b.offered, b.used, b.starved = 0, 0, false
	if !active(&u) {
		return dst
	}
	return append(dst, u)
}

func (b *simBudget) SetProvisional(_ any, l budget.Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.prov = l
}

func (b *simBudget) DropLease(now time.Time, _ string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drain(now)
	b.has = false
}

func (b *simBudget) SetShared(_ time.Time, _ any, kick func(), _ time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.kick = kick
}

func (b *simBudget) SetLease(now time.Time, _ string, l budget.Lease) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.drain(now) // the debt so far drains at the old rate
	// A debt run up under a larger lease is capped at the new burst: kept whole, it would
	// shut the partition out for debt / rate, long after the global bucket drained it.
	b.debt = min(b.debt, l.Burst)
	b.lease, b.has = l, true
	b.history = append(b.history, fmt.Sprintf("%s %.3g/%.3g", now.Format("05.000"), l.Rate, l.Burst))
}

// TestSimulatedInstancesHoldTheRate runs, in virtual time, eight instances against one Redis,
// each offering statements at fixed times through a simBudget, and checks what they admit
// together: about the budget's rate, no 1-second window above rate + burst, and a fair split.
func TestSimulatedInstancesHoldTheRate(t *testing.T) {
	const (
		interval = 500 * time.Millisecond
		cost     = 0.01 // execution seconds per statement
	)
	often := func(int) time.Duration { return time.Millisecond } // 10 s/s offered, 40× a share
	for _, tc := range []struct {
		name  string
		every func(i int) time.Duration // how often instance i offers a statement
		// down: Redis unreachable for a second mid-run. A call fails at once rather than
		// hang as on a stopped server: TestRedisPausedFallsBackAndRecovers holds calls.
		down  bool
		check func(t *testing.T, per []float64, span float64)
	}{
		{name: "equal demand", every: often},
		{name: "10:1 demand", every: func(i int) time.Duration {
			if i < 4 {
				return time.Millisecond
			}
			return 10 * time.Millisecond // 1 s/s: ten times less, still 4× a share
		}},
		{name: "small demand below its share", every: func(i int) time.Duration {
			if i == 0 {
				return 100 * time.Millisecond // 0.1 s/s, below its share of 0.25
			}
			return time.Millisecond
		}, check: func(t *testing.T, per []float64, span float64) {
			if got := per[0] / span; got < 0.09 {
				t.Errorf("the small instance admitted %.3f/s of the 0.1/s it offered", got)
			}
		}},
		{name: "Redis down", every: often, down: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := fakeclock.New()
			cr := newClockedRedis(t, simRedis(t), clk.Now)
			spec := Spec{Name: "sim-" + tc.name, Rate: 2, Burst: 1}
			rng := rand.New(rand.NewPCG(1, 1))
			budgets := make([]*simBudget, 8)
			loops := make([]*driven, len(budgets))
			for i := range budgets {
				b := &simBudget{admitted: map[int64]float64{}}
				c := newCoord(t, Options{Client: cr, Interval: interval, Instance: fmt.Sprintf("sim%d", i), Logger: quiet,
					Now: clk.Now, Rand: rand.New(rand.NewPCG(1, uint64(i)+2)).Float64})
				c.Register(spec, b)
				budgets[i], loops[i] = b, &driven{c: c}
			}

			ctx := context.Background()
			start := clk.Now()
			from, end := start.Add(2*time.Second), start.Add(5*time.Second)
			next := make([]time.Time, len(budgets))
			for i := range next {
				next[i] = start
			}
			order := rand.New(rand.NewPCG(1, 0)).Perm(len(budgets))
			for now := start; now.Before(end); clk.Advance(time.Millisecond) {
				now = clk.Now()
				cr.down.Store(tc.down && !now.Before(start.Add(3*time.Second)) && now.Before(start.Add(4*time.Second)))
				rng.Shuffle(len(order), func(a, b int) { order[a], order[b] = order[b], order[a] })
				for _, i := range order {
					for ; !next[i].After(now) && next[i].Before(end); next[i] = next[i].Add(tc.every(i)) {
						budgets[i].admit(next[i], cost)
					}
					loops[i].step(ctx, now)
				}
			}

			b0, b1 := from.UnixNano()/int64(100*time.Millisecond), end.UnixNano()/int64(100*time.Millisecond)
			total := make([]float64, b1-b0)
			per := make([]float64, len(budgets))
			for i, b := range budgets {
				for k, v := range b.admitted {
					if k >= b0 && k < b1 {
						total[k-b0] += v
						per[i] += v
					}
				}
			}
			span := end.Sub(from).Seconds()
			sum, worst := 0.0, 0.0
			for i, v := range total {
				sum += v
				if i+10 <= len(total) {
					w := 0.0
					for _, x := range total[i : i+10] {
						w += x
					}
					worst = max(worst, w)
				}
			}
			aggregate := sum / span
			t.Logf("aggregate %.3f execution-s/s for a rate of %v; largest 1 s window %.3f; Jain %.3f; per instance %.3v",
				aggregate, spec.Rate, worst, jain(per), per)
			if aggregate < 0.95*spec.Rate || aggregate > 1.05*spec.Rate {
				t.Errorf("aggregate %.3f, want within 5%% of %v", aggregate, spec.Rate)
			}
			if worst > spec.Rate+spec.Burst+cost {
				t.Errorf("a 1 s window admitted %.3f > rate + burst = %v", worst, spec.Rate+spec.Burst)
			}
			if tc.check != nil {
				tc.check(t, per, span)
			} else if j := jain(per); j < 0.95 {
				t.Errorf("Jain's index %.3f < 0.95", j)
			}
			if t.Failed() {
				for i, b := range budgets {
					t.Logf("instance %d leases: %v", i, b.history)
				}
			}
		})
	}
}

// TestSimulatedInstancesHoldMaxConcurrent runs, in virtual time, eight instances whose
// workers hold slots for 20 to 40 ms at a time, four workers on half of them and one on the
// others, and counts the statements running across all of them: never more than
// max_concurrent.
func TestSimulatedInstancesHoldMaxConcurrent(t *testing.T) {
	cfg := slotConfig{name: "slots", instances: 8, limit: 8, interval: 500 * time.Millisecond,
		stmt: 20 * time.Millisecond, duration: 3 * time.Second, seed: 1,
		workers: func(i int, _ time.Duration) int {
			if i%2 == 0 {
				return 4
			}
			return 1
		}}
	r := simulateSlots(t, cfg)
	t.Logf("at most %d running of %d; %d admitted, %d refused", r.most, cfg.limit, r.admitted, len(r.refusals))
	if r.most > cfg.limit {
		t.Fatalf("%d statements ran at once, max_concurrent is %d", r.most, cfg.limit)
	}
	if r.admitted == 0 {
		t.Fatal("no statement ran")
	}
}
