package coord

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// Each shared budget syncs on its own loop: a budget that needs a lease never waits for the
// syncs of the others, only for its turn among the calls on their way (maxCalls).

// registerIdle registers n idle budgets of spec with c, named spec.Name and a number (an idle
// budget without `per` renews its lease once per interval: keepUnkeyed), and returns the local
// budget and the handle of the one in the middle.
func registerIdle(c *Coordinator, n int, spec Spec) (notifyLocal, *Handle) {
	var target notifyLocal
	var handle *Handle
	name := spec.Name
	for i := range n {
		l := notifyLocal{newFakeLocal(0, 0), make(chan string, 1024)}
		spec.Name = fmt.Sprintf("%s%02d", name, i)
		if h := c.Register(spec, l); i == n/2 {
			target, handle = l, h
		}
	}
	return target, handle
}

// firstLease adds the partition key to n, offering demand and wanting a slot, kicks its budget
// (h) as the budget does when it meets a new partition, and returns how long the partition's
// first lease took to come.
func (n notifyLocal) firstLease(h *Handle, key string, demand float64) time.Duration {
	for len(n.set) > 0 {
		<-n.set
	}
	n.mu.Lock()
	n.keys = append(n.keys, key)
	n.demand, n.wanted = demand, 1
	n.mu.Unlock()
	begun := time.Now()
	h.Kick()
	n.waitLease(key)
	return time.Since(begun)
}

// TestManyBudgetsNewPartitionOnSlowRedis: one instance with 24 shared budgets and a Redis
// whose every call takes about 40 ms (a proxy delaying 20 ms each way; well inside a sync's
// deadline of 250 ms, so no sync fails). A new `per` value of one budget, kicked as the
// budget kicks when it meets one, gets its first lease about the early-sync gap plus a few
// calls later, as with one budget: not after the syncs of the other 23 that are due.
func TestManyBudgetsNewPartitionOnSlowRedis(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	const interval = time.Second
	const budgets = 24
	// From a URL, as the driver makes it: a pool of maxCalls connections.
	c := newCoord(t, Options{URL: "redis://" + px.Addr + "/0", Interval: interval, Logger: quiet})
	target, handle := registerIdle(c, budgets, Spec{Name: "slow", Rate: 1, Burst: 1, MaxConcurrent: 4})
	px.SetDelay(10 * time.Millisecond)
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	time.Sleep(3 * interval) // every budget leased, syncing every interval

	var waits []time.Duration
	for k := range 6 {
		waits = append(waits, target.firstLease(handle, fmt.Sprintf("new%d", k), 0.01))
		time.Sleep(interval / 3)
	}
	var call time.Duration
	for _, st := range c.Status() {
		call = max(call, st.Latency)
	}
	worst := time.Duration(0)
	for _, w := range waits {
		worst = max(worst, w)
	}
	bound := newGap(interval) + 4*call
	t.Logf("a sync call takes %v; a new partition's first lease came after %v (bound: the early sync's gap plus four calls, %v)",
		call, waits, bound)
	if worst > bound {
		t.Errorf("a new partition waited %v for its first lease, %.1f× the early-sync gap plus four calls (%v): it waits for the syncs of the other %d budgets",
			worst, float64(worst)/float64(bound), bound, budgets-1)
	}
}

// TestManyBudgetsNewPartitionOnHungRedis: the same 24 budgets, Redis stopped (SIGSTOP): every
// call fails at its deadline (a quarter interval). A new partition of one budget gets its
// first fallback share once that budget's own sync has failed, about a deadline after it
// asks, not after a failing sync of every other budget.
func TestManyBudgetsNewPartitionOnHungRedis(t *testing.T) {
	srv := redistest.Need(t)
	const interval = time.Second
	const budgets = 24
	c := newCoord(t, Options{URL: srv.URL, Interval: interval, Logger: quiet})
	target, handle := registerIdle(c, budgets, Spec{Name: "hung", MaxConcurrent: 8})
	c.Start()
	t.Cleanup(func() { c.Close(context.Background()) })
	time.Sleep(2 * interval)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Resume() })
	time.Sleep(4 * interval) // every lease lapsed; every budget's syncs fail

	deadline := max(interval/4, minDeadline)
	var waits []time.Duration
	for k := range 4 {
		key := fmt.Sprintf("new%d", k)
		waits = append(waits, target.firstLease(handle, key, 0))
		if l := target.lease(key); l.Slots == 0 {
			t.Fatalf("partition %s got lease %+v with Redis hung, want its fallback share of slots", key, l)
		}
	}
	worst := time.Duration(0)
	for _, w := range waits {
		worst = max(worst, w)
	}
	t.Logf("with Redis hung, a new partition's fallback share came after %v (a sync's deadline is %v)", waits, deadline)
	if worst > 3*deadline {
		t.Errorf("a new partition waited %v (%.1f sync deadlines) for its fallback share with Redis hung: it waits for the failing syncs of the other %d budgets",
			worst, float64(worst)/float64(deadline), budgets-1)
	}
}

// TestManyBudgetsLeasesNeverSumAboveLimit: two instances share max_concurrent 8 of budget x,
// both wanting all 8. Instance A also shares 40 idle budgets and reaches Redis in about 20 ms a
// call, with a sync_interval of 200 ms (x's lease lasts 500 ms). Synced one after another, A's
// budgets took 41 calls, 820 ms, a round: x's lease lapsed in Redis, which handed its slots
// to B, while A's local budget still enforced it. On loops of their own, with maxCalls calls on
// their way, x is renewed every interval, and the leases the two local budgets enforce never
// sum above 8 while their syncs succeed. (A sync that fails, as one may on a loaded machine
// within its 100 ms deadline, or one not sent while earlier calls are still on their way, puts
// an instance on its last lease and then its fallback share, which may sum above the limit:
// README's known limitation. The samples within a lease of such a failure, and those taken
// while an instance's last successful sync of x is more than two intervals old, are left out.)
func TestManyBudgetsLeasesNeverSumAboveLimit(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 0)
	const interval = 200 * time.Millisecond
	spec := Spec{Name: "x", MaxConcurrent: 8}
	a := newCoord(t, Options{URL: "redis://" + px.Addr + "/0", Interval: interval, Logger: quiet, Instance: "a"})
	b := newCoord(t, Options{Client: newClient(t, srv), Interval: interval, Logger: quiet, Instance: "b"})
	la, lb := newFakeLocal(1, 8), newFakeLocal(1, 8)
	for i := range 40 {
		a.Register(Spec{Name: fmt.Sprintf("idle%02d", i), MaxConcurrent: 4}, newFakeLocal(0, 0))
	}
	a.Register(spec, la)
	b.Register(spec, lb)
	px.SetDelay(10 * time.Millisecond)
	a.Start()
	b.Start()
	t.Cleanup(func() { a.Close(context.Background()); b.Close(context.Background()) })
	time.Sleep(5 * interval)
	// failures is how many syncs of x failed on either instance, and oldest the older of their
	// last successful syncs of x (the zero Time while one has none).
	failures := func() (n uint64, oldest time.Time) {
		first := true
		for _, c := range []*Coordinator{a, b} {
			for _, st := range c.Status() {
				if st.Name == spec.Name {
					n += st.Failures
					if first || st.LastSync.Before(oldest) {
						oldest, first = st.LastSync, false
					}
				}
			}
		}
		return n, oldest
	}
	most, over, n, left := 0, 0, 0, 0
	lastFailures, _ := failures()
	lastFailed := time.Time{}
	for end := time.Now().Add(25 * interval); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		sum := la.lease("").Slots + lb.lease("").Slots
		f, oldest := failures()
		if f != lastFailures {
			lastFailures, lastFailed = f, time.Now()
		}
		if !lastFailed.IsZero() && time.Since(lastFailed) < 3*interval || time.Since(oldest) > 2*interval {
			left++
			continue
		}
		most = max(most, sum)
		n++
		if sum > spec.MaxConcurrent {
			over++
		}
	}
	var latency time.Duration
	for _, st := range a.Status() {
		latency = max(latency, st.Latency)
	}
	t.Logf("A's calls take %v; the two instances' slots summed to at most %d, above %d in %d of %d samples (%d left out after a failed or late sync of x)",
		latency, most, spec.MaxConcurrent, over, n, left)
	if n == 0 {
		t.Fatalf("every sample came within a lease of a failed or late sync of x, on a Redis 20 ms away with a 100 ms deadline")
	}
	if most > spec.MaxConcurrent {
		t.Errorf("the instances enforced %d slots at once, max_concurrent is %d (%.0f%% of the samples)",
			most, spec.MaxConcurrent, 100*float64(over)/float64(n))
	}
}
