package budget

import (
	"sync"
	"testing"
	"time"
)

// manyKeys returns a budget holding n idle keys, each with cost of debt.
func manyKeys(t testing.TB, n int, cost float64) *Budget {
	b := New(Spec{Rate: 1, Burst: 10, MaxConcurrent: 10, MaxKeys: 2 * n})
	keys := benchKeys(n)
	for _, k := range keys {
		r := Request{Budget: b, Key: k, Cost: cost}
		if _, d := Admit(t0, []Request{r}, nil); d != nil {
			t.Fatalf("denied: %+v", *d)
		}
		Release(t0, &r, cost)
	}
	return b
}

// TestScrapeLetsStatementsIn: a scrape of a budget with 100,000 keys releases the budget's
// lock every scrapeChunk keys, and a statement is admitted and released in such a pause, while
// the scrape is provably in progress. The snapshot still sums every key.
func TestScrapeLetsStatementsIn(t *testing.T) {
	const n = 100_000
	b := manyKeys(t, n, 0.5)
	pauses, admitted := 0, false
	testHookPause = func() {
		pauses++
		if pauses != 1 {
			return
		}
		// The scrape is between two chunks: a statement of another goroutine must get in now.
		done := make(chan *Denial)
		go func() {
			r := Request{Budget: b, Key: "late", Cost: 0.25}
			_, d := Admit(t0, []Request{r}, nil)
			if d == nil {
				Release(t0, &r, 0.25)
			}
			done <- d
		}()
		if d := <-done; d != nil {
			t.Errorf("admission in a scrape's pause denied: %+v", *d)
		}
		admitted = true
	}
	t.Cleanup(func() { testHookPause = nil })
	s := b.Snapshot(t0)
	if !admitted {
		t.Fatal("no statement was admitted during the scrape")
	}
	if want := n / scrapeChunk; pauses < want {
		t.Errorf("%d pauses in a scrape of %d keys, want at least %d (one per %d keys)", pauses, n, want, scrapeChunk)
	}
	// The key added in the pause may or may not be counted; the others all are.
	if s.Keys != n || s.Debt < 0.5*n-1e-6 || s.Debt > 0.5*n+0.25+1e-6 || s.MaxDebt != 0.5 {
		t.Errorf("snapshot keys %d debt %v max %v, want %d keys, debt %v (+0.25), max 0.5", s.Keys, s.Debt, s.MaxDebt, n, 0.5*n)
	}
}

// TestScrapeSumsDrainedDebt: a snapshot sums each key's debt drained to its own time.
func TestScrapeSumsDrainedDebt(t *testing.T) {
	b := manyKeys(t, 3*scrapeChunk+1, 0.5)
	charge(t, at(0), b, "", 2)
	s := b.Snapshot(at(0.25)) // rate 1: each key has drained 0.25
	want := float64(3*scrapeChunk+1)*0.25 + 1.75
	if d := s.Debt - want; d > 1e-6 || d < -1e-6 || s.MaxDebt != 1.75 {
		t.Errorf("debt %v max %v, want %v and 1.75", s.Debt, s.MaxDebt, want)
	}
}

// TestKickOutsideTheLock: a shared budget that refuses a statement kicks its coordinator
// after unlocking: the kick is the coordinator's code, and must not run under the lock.
func TestKickOutsideTheLock(t *testing.T) {
	b := New(Spec{Rate: 1, Burst: 1, MaxConcurrent: 2})
	kicks := 0
	b.SetShared(t0, nil, func() {
		kicks++
		if !b.mu.TryLock() {
			t.Error("kicked with the budget locked")
			return
		}
		b.mu.Unlock()
	}, time.Millisecond)
	// No lease yet: the request is refused for want of one, and the coordinator kicked.
	if _, d := Admit(t0, []Request{{Budget: b, Key: "a", Cost: 0.1}}, nil); d == nil {
		t.Fatal("admitted without a lease")
	}
	if kicks != 1 {
		t.Fatalf("%d kicks, want 1", kicks)
	}
}

// BenchmarkScrapeWhileAdmitting admits and releases statements in parallel while another
// goroutine scrapes a budget of 100,000 keys without pause. An admission waits at most one
// chunk of a scrape for the lock, so ns/op stays near that of admissions alone; were the lock
// held for a whole scrape, it would approach the time of a scrape.
func BenchmarkScrapeWhileAdmitting(b *testing.B) {
	bud := manyKeys(b, 100_000, 0.5)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
				bud.Snapshot(t0)
			}
		}
	})
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := Request{Budget: bud, Key: "hot", Cost: 1e-6}
		for pb.Next() {
			if _, d := Admit(t0, []Request{r}, nil); d != nil {
				b.Errorf("denied: %+v", *d)
				return
			}
			Release(t0, &r, 1e-6)
		}
	})
	b.StopTimer()
	close(stop)
	wg.Wait()
}

// TestSetSpecUnchangedWalksNoKeys: a reload that leaves a budget's spec as it was does not walk
// its keys under the lock (a budget keyed per tenant may hold a hundred thousand); a changed
// spec still drains each key to the reload's time at the old rate.
func TestSetSpecUnchangedWalksNoKeys(t *testing.T) {
	spec := Spec{Rate: 1, Burst: 10}
	b := New(spec)
	charge(t, at(0), b, "k", 4)
	b.SetSpec(at(1), spec)
	if last := b.keys.byKey["k"].Last; !last.Equal(at(0)) {
		t.Errorf("an unchanged spec touched the key (drained to %v)", last.Sub(t0))
	}
	spec.Rate = 2
	b.SetSpec(at(1), spec)
	if s := b.keys.byKey["k"]; !s.Last.Equal(at(1)) || s.Debt != 3 {
		t.Errorf("a changed spec left the key at debt %v as of %v, want 3 as of 1s", s.Debt, s.Last.Sub(t0))
	}
}

// TestTakeUsageLetsStatementsIn: building a sync of a shared budget with 100,000 active
// partitions (its usage taken per key) releases the budget's lock every scrapeChunk keys,
// and a statement is admitted in such a pause; every key's usage is still taken once.
func TestTakeUsageLetsStatementsIn(t *testing.T) {
	const n = 100_000
	b := New(Spec{MaxConcurrent: 4, MaxKeys: 2 * n})
	b.SetShared(t0, nil, func() {}, time.Millisecond)
	keys := benchKeys(n)
	for _, k := range keys {
		b.SetLease(t0, k, Lease{Slots: 1})
		r := Request{Budget: b, Key: k}
		if _, d := Admit(t0, []Request{r}, nil); d != nil {
			t.Fatalf("denied: %+v", *d)
		}
		Release(t0, &r, 0)
	}
	pauses, admitted := 0, false
	testHookPause = func() {
		if pauses++; pauses != 1 {
			return
		}
		done := make(chan *Denial)
		go func() {
			r := Request{Budget: b, Key: keys[0]}
			_, d := Admit(t0, []Request{r}, nil)
			if d == nil {
				Release(t0, &r, 0)
			}
			done <- d
		}()
		if d := <-done; d != nil {
			t.Errorf("admission in a pause of TakeUsage denied: %+v", *d)
		}
		admitted = true
	}
	t.Cleanup(func() { testHookPause = nil })
	us := b.TakeUsage(t0, nil)
	if !admitted {
		t.Fatal("no statement was admitted while the usage was taken")
	}
	if want := n / scrapeChunk; pauses < want {
		t.Errorf("%d pauses taking the usage of %d keys, want at least %d", pauses, n, want)
	}
	seen := map[string]bool{}
	for _, u := range us {
		if seen[u.Key] {
			t.Fatalf("key %q taken twice", u.Key)
		}
		seen[u.Key] = true
	}
	if len(seen) < n {
		t.Errorf("usage of %d keys taken, want %d", len(seen), n)
	}
}
