package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// outcome is when a statement returned, and its error.
type outcome struct {
	at  time.Time
	err error
}

// TestSharedWaitersStayCountedAndWithinLimit: two instances (driver.NewPool) share a
// budget `per: tenant` with max_concurrent 2, max_wait 5s, at sync_interval 100ms. Instance A
// runs two statements of tenant t for 2.5 s: it holds both of the tenant's slots. Instance B
// meets tenant t with one statement of 0.5 s (on its provisional lease: the README's
// documented excess "for at most about an interval"), then sends two statements of tenant t
// that wait (max_wait 5s) for a slot.
//
// Promises: doc.go ("What the local budget must offer") reports "the peak number of statements
// that wanted a slot at once (in flight plus every statement refused or waiting for a slot since
// the last report)"; the README, grants "that never sum above the budget"; and a statement waiting
// under max_wait is admitted "the moment a slot is released, the bucket has room" (README,
// Rolling out a budget), with "Statements waiting for capacity (max_wait) must be woken by
// SetLease as by a release: a larger lease is capacity" (doc.go). So B's waiters may run only
// once A's statements end, and then must run within a few sync intervals (they have seconds
// of max_wait left, and nothing else of the tenant is in flight anywhere).
func TestSharedWaitersStayCountedAndWithinLimit(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: tenants, mode: enforce, per: tenant, max_concurrent: 2, max_wait: 5s, max_queue: 4}
rules:
  - {budget: tenants, match: {app: saas}}
`, srv.URL)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var logs lockedBuffer
	a := openSharedPool(t, dsn, rules, &logs)
	b := openSharedPool(t, dsn, rules, &logs)
	tctx := tagging.With(context.Background(), "app", "saas", "tenant", "t")

	// Both instances meet one partition together, so that each knows of the other.
	wctx := tagging.With(context.Background(), "app", "saas", "tenant", "warm")
	if !eventually(5*time.Second, func() bool {
		_, ea := a.Exec(wctx, "select 1")
		_, eb := b.Exec(wctx, "select 1")
		return ea == nil && eb == nil && sharedStatusOf(t, a, "tenants").Instances == 2 &&
			sharedStatusOf(t, b, "tenants").Instances == 2
	}) {
		t.Fatalf("the instances never saw each other: %+v %+v", sharedStatusOf(t, a, "tenants"), sharedStatusOf(t, b, "tenants"))
	}

	// A takes both slots of tenant t for 2.5 s.
	var aWG sync.WaitGroup
	aEnded := make(chan time.Time, 2)
	for range 2 {
		aWG.Add(1)
		go func() {
			defer aWG.Done()
			if _, err := a.Exec(tctx, "select pg_sleep(2.5), 'waitersA'"); err != nil {
				t.Errorf("A: %v", err)
			}
			aEnded <- time.Now()
		}()
	}
	// Both running on the server (not merely admitted and waiting for a connection).
	if !eventually(5*time.Second, func() bool { return activeOf(t, admin, "waitersA") == 2 }) {
		t.Fatalf("A never had both statements running: %+v", a.Snapshot().Budgets)
	}
	// B meets tenant t: its first statement runs on the provisional lease for 0.5 s.
	bMet := time.Now()
	bLong := make(chan outcome, 1)
	go func() {
		_, err := b.Exec(tctx, "select pg_sleep(0.5)")
		bLong <- outcome{time.Now(), err}
	}()
	if !eventually(3*time.Second, func() bool { return budgetInFlight(b, "tenants") == 1 }) {
		t.Fatalf("B's first statement of tenant t never ran: %+v", b.Snapshot().Budgets)
	}
	time.Sleep(200 * time.Millisecond) // B's grant of tenant t comes meanwhile: no slot

	// B's two waiters.
	out := make(chan outcome, 2)
	for range 2 {
		go func() {
			_, err := b.Exec(tctx, "select 1")
			out <- outcome{time.Now(), err}
		}()
	}
	var got []outcome
	for range 2 {
		got = append(got, <-out)
	}
	aWG.Wait()
	close(aEnded)
	aEnd, aLast := time.Now(), time.Time{}
	for at := range aEnded {
		if at.Before(aEnd) {
			aEnd = at
		}
		if at.After(aLast) {
			aLast = at
		}
	}
	bl := <-bLong
	if bl.err != nil {
		t.Fatalf("B's first statement: %v", bl.err)
	}
	var wrong []string
	for i, o := range got {
		rel := func(at time.Time) string {
			return fmt.Sprintf("%v after B met tenant t, %v after A's first statement ended", at.Sub(bMet).Round(time.Millisecond),
				at.Sub(aEnd).Round(time.Millisecond))
		}
		switch {
		case o.err == nil && o.at.Before(aEnd) && o.at.Sub(bMet) > 300*time.Millisecond:
			wrong = append(wrong, fmt.Sprintf("waiter %d admitted while A held both slots (3 in flight for the tenant): %s", i, rel(o.at)))
		case o.err == nil && o.at.Sub(aLast) > time.Second:
			wrong = append(wrong, fmt.Sprintf("waiter %d admitted only %s (%v after A's last ended)", i, rel(o.at),
				o.at.Sub(aLast).Round(time.Millisecond)))
		case o.err != nil:
			wrong = append(wrong, fmt.Sprintf("waiter %d refused %s (both of the tenant's slots free for %v of its 5 s max_wait): %v",
				i, rel(o.at), o.at.Sub(aLast).Round(time.Millisecond), o.err))
		}
		t.Logf("waiter %d: %v at %s", i, o.err, rel(o.at))
	}
	if len(wrong) > 0 {
		t.Errorf("B's waiters (B's first statement ended %v after B met tenant t):\n%s", bl.at.Sub(bMet).Round(time.Millisecond),
			strings.Join(wrong, "\n"))
	}
}

// budgetInFlight is budget name's statements in flight on p.
func budgetInFlight(p *driver.Pool, name string) int {
	for _, bs := range p.Snapshot().Budgets {
		if bs.Name == name {
			return bs.InFlight
		}
	}
	return -1
}
