package budget

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func keysOf(b *Budget) map[string]bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	m := make(map[string]bool, len(b.keys.byKey))
	for k := range b.keys.byKey {
		m[k] = true
	}
	return m
}

func TestEvictionOrder(t *testing.T) {
	type step struct {
		key     string
		cost    float64
		hold    bool // leave the query in flight
		atSec   float64
		evicted string // the key expected gone after this step; "" none
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"soonest empty first", []step{
			{key: "a", cost: 1}, {key: "b", cost: 3}, {key: "c", cost: 2},
			{key: "d", cost: 1, atSec: 0.5, evicted: "a"},
			{key: "e", cost: 1, atSec: 0.5, evicted: "d"}, // d empties at 1.5s, c at 2s
		}},
		{"empty before soonest", []step{
			{key: "a", cost: 5}, {key: "b", cost: 0}, {key: "c", cost: 4},
			{key: "d", cost: 1, atSec: 1, evicted: "b"},
		}},
		{"all drained: the first to empty goes", []step{
			{key: "a", cost: 3}, {key: "b", cost: 1}, {key: "c", cost: 2},
			{key: "d", cost: 1, atSec: 5, evicted: "b"},
		}},
		{"in flight never evicted", []step{
			{key: "a", cost: 0, hold: true}, {key: "b", cost: 9}, {key: "c", cost: 9},
			{key: "d", cost: 1, atSec: 1, evicted: "b"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := New(Spec{Rate: 1, Burst: 10, MaxKeys: 3})
			for _, s := range tt.steps {
				before := keysOf(b)
				admit1(t, at(s.atSec), b, s.key, s.cost)
				if !s.hold {
					Release(at(s.atSec), &Request{Budget: b, Key: s.key, Cost: s.cost}, s.cost)
				}
				after := keysOf(b)
				var gone []string
				for k := range before {
					if !after[k] {
						gone = append(gone, k)
					}
				}
				if s.evicted == "" && len(gone) != 0 || s.evicted != "" && (len(gone) != 1 || gone[0] != s.evicted) {
					t.Fatalf("adding %q evicted %v, want %q", s.key, gone, s.evicted)
				}
				mustInvariants(t, b)
			}
		})
	}
}

func TestInFlightOverflow(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxKeys: 2})
	for _, k := range []string{"a", "b", "c"} {
		admit1(t, at(0), b, k, 1) // all held: the table must grow past its bound
	}
	if n := b.Snapshot(at(0)).Keys; n != 3 {
		t.Fatalf("keys = %d, want 3 (in-flight states are never evicted)", n)
	}
	for _, k := range []string{"a", "b", "c"} {
		Release(at(0), &Request{Budget: b, Key: k, Cost: 1}, 1)
	}
	admit1(t, at(0), b, "d", 1)
	if s := b.Snapshot(at(0)); s.Keys != 2 || s.Evicted != 2 {
		t.Errorf("after releases and a new key: %+v, want 2 keys, 2 evicted", s)
	}
	mustInvariants(t, b)
}

// TestMillionKeys churns 1,000,000 distinct keys through a 100,000-key table
// (under the race detector, which slows map and heap work tenfold, 200,000
// keys through 20,000).
func TestMillionKeys(t *testing.T) {
	n, bound := 1_000_000, DefaultMaxKeys
	if raceEnabled {
		n, bound = 200_000, 20_000
	}
	b := New(Spec{Rate: 0.05, Burst: 1, MaxConcurrent: 1, MaxKeys: bound})
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	for i := range n {
		now := at(float64(i) * 1e-5)
		k := "tenant-" + strconv.Itoa(i)
		if _, d := Admit(now, []Request{{Budget: b, Key: k, Cost: 0.01}}, nil); d != nil {
			t.Fatalf("key %d denied: %+v", i, *d)
		}
		Release(now, &Request{Budget: b, Key: k, Cost: 0.01}, 0.02)
		if i%(n/10) == 0 {
			if keys := b.Snapshot(now).Keys; keys > bound {
				t.Fatalf("after %d keys the table holds %d > %d", i, keys, bound)
			}
		}
	}
	s := b.Snapshot(at(10))
	if s.Keys != bound || s.Evicted != uint64(n-bound) || s.InFlight != 0 {
		t.Errorf("snapshot %+v, want %d keys, %d evicted", s, bound, n-bound)
	}
	mustInvariants(t, b)
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("%d distinct keys, table of %d: heap %.1f MB", n, s.Keys, float64(ms.HeapAlloc-base)/1e6)
	runtime.KeepAlive(b)
}

// TestConcurrentAdmitRelease hammers three budgets from several goroutines,
// checks that no key ever has more than MaxConcurrent in flight as observed
// from outside, and checks the invariants once everything is released.
func TestConcurrentAdmitRelease(t *testing.T) {
	budgets := []*Budget{
		New(Spec{Rate: 2, Burst: 1, MaxConcurrent: 3, WarningThreshold: 0.8}),
		New(Spec{MaxConcurrent: 2, MaxKeys: 4}),
		New(Spec{Rate: 0.5, Burst: 0.05, PerQueryLimit: 0.009}),
	}
	var maxConcurrent [3]int
	for i, b := range budgets {
		maxConcurrent[i] = b.Snapshot(t0).Spec.MaxConcurrent
	}
	var clock atomic.Int64 // nanoseconds since t0; each operation advances it
	var observed [3][8]atomic.Int32
	const workers, ops = 8, 3000
	var wg sync.WaitGroup
	var failed atomic.Bool
	var admitted [3]atomic.Int64 // admissions per budget
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 1))
			var warns []Warning
			for range ops {
				keys := [3]int{rng.IntN(8), rng.IntN(8), rng.IntN(8)}
				reqs := make([]Request, 0, 3)
				for i, b := range budgets {
					if rng.IntN(3) > 0 {
						reqs = append(reqs, Request{Budget: b, Key: strconv.Itoa(keys[i]), Cost: rng.Float64() * 0.01})
					}
				}
				rng.Shuffle(len(reqs), func(i, j int) { reqs[i], reqs[j] = reqs[j], reqs[i] })
				now := t0.Add(time.Duration(clock.Add(int64(rng.IntN(200_000)))))
				var d *Denial
				warns, d = Admit(now, reqs, warns[:0])
				if d != nil {
					continue
				}
				for _, r := range reqs {
					bi := idx(budgets, r.Budget)
					admitted[bi].Add(1)
					k, _ := strconv.Atoi(r.Key)
					if n := observed[bi][k].Add(1); maxConcurrent[bi] > 0 && int(n) > maxConcurrent[bi] {
						failed.Store(true)
					}
				}
				runtime.Gosched()
				for _, r := range reqs {
					observed[idx(budgets, r.Budget)][mustAtoi(r.Key)].Add(-1)
					done := t0.Add(time.Duration(clock.Add(int64(rng.IntN(200_000)))))
					Release(done, &Request{Budget: r.Budget, Key: r.Key, Cost: r.Cost}, rng.Float64()*0.01)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		t.Error("a key had more than MaxConcurrent queries in flight")
	}
	for i, b := range budgets {
		mustInvariants(t, b)
		s := b.Snapshot(t0.Add(time.Duration(clock.Load())))
		if s.InFlight != 0 || !(s.Debt >= 0) || admitted[i].Load() == 0 {
			t.Errorf("budget %d after %d admissions: %+v", i, admitted[i].Load(), s)
		}
	}
}

func idx(bs []*Budget, b *Budget) int {
	for i := range bs {
		if bs[i] == b {
			return i
		}
	}
	panic("unknown budget")
}

func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		panic(err)
	}
	return n
}

// FuzzOps reads the input as a program of admissions, releases, reloads and
// time steps over two small budgets, and checks the invariants after each.
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte("\x00\x10\x20\x30\x01\x11\x21\x31\x02\x12\x03\x13\x04\x14\x05\x15"))
	f.Add([]byte{0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 3, 3, 3, 3, 2, 2, 2, 2})
	f.Fuzz(fuzzBody)
}

func fuzzBody(t *testing.T, prog []byte) {
	bs := []*Budget{
		New(Spec{Rate: 1, Burst: 2, MaxConcurrent: 2, MaxKeys: 3, WarningThreshold: 0.5}),
		New(Spec{Rate: 0.25, Burst: 1, PerQueryLimit: 0.75, MaxKeys: 2}),
	}
	type held struct {
		b    *Budget
		key  string
		cost float64
	}
	var inFlight []held
	var now int64
	for len(prog) >= 2 {
		op, arg := prog[0], prog[1]
		prog = prog[2:]
		key := string(rune('a' + arg%5))
		cost := float64(arg>>3) / 16
		switch op % 5 {
		case 0, 1: // admit on one or both budgets
			reqs := []Request{{Budget: bs[op%2], Key: key, Cost: cost}}
			if op&16 != 0 {
				reqs = append(reqs, Request{Budget: bs[1-op%2], Key: key, Cost: cost})
			}
			if _, d := Admit(t0.Add(time.Duration(now)), reqs, nil); d == nil {
				for _, r := range reqs {
					inFlight = append(inFlight, held{r.Budget, r.Key, r.Cost})
				}
			} else if d.RetryAfter < 0 {
				t.Fatalf("negative RetryAfter %v", d.RetryAfter)
			}
		case 2: // release the oldest, with an actual cost from arg
			if len(inFlight) > 0 {
				h := inFlight[0]
				inFlight = inFlight[1:]
				Release(t0.Add(time.Duration(now)), &Request{Budget: h.b, Key: h.key, Cost: h.cost}, float64(arg)/64)
			}
		case 3: // time passes, sometimes backwards
			now += (int64(arg) - 32) * int64(time.Millisecond) * 10
		case 4: // stray release, or a reload
			if arg&1 == 0 {
				Release(t0.Add(time.Duration(now)), &Request{Budget: bs[arg>>1%2], Key: key, Cost: cost}, cost)
			} else {
				sp := bs[0].Snapshot(t0.Add(time.Duration(now))).Spec
				sp.Rate = float64(arg>>2) / 8
				sp.MaxKeys = int(arg>>4) + 1
				bs[0].SetSpec(t0.Add(time.Duration(now)), sp)
			}
		}
		for _, b := range bs {
			if err := invariants(b); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Every admitted slot is still counted, including stray releases that
	// the budget could not tell apart from real ones (see Release).
	total := 0
	for _, b := range bs {
		total += b.Snapshot(t0.Add(time.Duration(now))).InFlight
	}
	if total > len(inFlight) {
		t.Errorf("%d in flight, only %d admitted and not released", total, len(inFlight))
	}
}

func TestFuzzSeedsRun(t *testing.T) {
	// A quick deterministic pass over random programs, so the fuzz body is
	// exercised by plain `go test` beyond its seed corpus.
	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 200 {
		prog := make([]byte, 64)
		for j := 0; j < len(prog); j += 8 {
			binary.LittleEndian.PutUint64(prog[j:], rng.Uint64())
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { fuzzBody(t, prog) })
	}
}

// TestAdjustKeepsEvictionOrder: a correction of a released charge (Adjust) moves an idle key
// in the eviction order by its new empty time: refunded to empty, the key that held the most
// debt is the first evicted. A refund never leaves a debt below zero, and a key that is gone
// is left alone.
func TestAdjustKeepsEvictionOrder(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 10, MaxKeys: 3})
	for _, k := range []struct {
		key  string
		cost float64
	}{{"a", 1}, {"b", 3}, {"c", 2}} {
		admit1(t, at(0), b, k.key, k.cost)
		Release(at(0), &Request{Budget: b, Key: k.key, Cost: k.cost}, k.cost)
	}
	Adjust(at(0), Request{Budget: b, Key: "b"}, -5) // trued up: b owed nothing after all
	mustInvariants(t, b)
	if d := b.Snapshot(at(0)).Debt; d != 3 {
		t.Fatalf("debt %v after b's refund, want a's 1 and c's 2", d)
	}
	Adjust(at(0), Request{Budget: b, Key: "gone"}, 1)
	before := keysOf(b)
	admit1(t, at(0.5), b, "d", 1)
	if after := keysOf(b); !before["b"] || after["b"] || !after["a"] || !after["c"] {
		t.Fatalf("keys %v after adding d, want b evicted (empty since its refund)", after)
	}
	mustInvariants(t, b)
}
