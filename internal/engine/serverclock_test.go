package engine

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestServerClockCharges: a statement is charged the client's measurement less the network's
// round trip, until the server reports its pattern; then it is charged its prediction, on the
// server's clock, until the report lapses.
func TestServerClockCharges(t *testing.T) {
	e, clk := newEngine(t, `
server_cores: 1
budgets:
  - {name: r, mode: enforce, server_share: 0.000001, burst_limit: 100s}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	const q = "select v from t where id = $1"
	debt := func() float64 {
		for _, b := range e.Budgets() {
			return b.Snapshot.Debt
		}
		return 0
	}
	charged := func(took time.Duration) float64 {
		t.Helper()
		before := debt()
		if err := run(e, clk, ctx, q, took); err != nil {
			t.Fatal(err)
		}
		return debt() - before
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-3 }

	if got := charged(300 * time.Millisecond); !near(got, 0.3) {
		t.Fatalf("client clock: charged %v, want 0.3", got)
	}
	e.SetNetworkFloor(100 * time.Millisecond)
	if got := charged(300 * time.Millisecond); !near(got, 0.2) {
		t.Fatalf("client clock less a 100ms round trip: charged %v, want 0.2", got)
	}
	p, _ := e.patterns.Get(q)
	fp := p.FingerprintID
	if e.ObserveServer(fp, 42, 0.01, clk.Now().Add(time.Minute)) == nil {
		t.Fatal("a report for a query identifier the pattern does not have was taken")
	}
	e.model.PutQueryID(fp, "", 42)
	if ids := e.QueryIDs(nil, 10); len(ids) != 1 || ids[0].Fingerprint != fp || ids[0].ID != 42 {
		t.Fatalf("QueryIDs = %+v", ids)
	}
	if err := e.ObserveServer(fp, 42, 0.01, clk.Now().Add(time.Minute)); err != nil {
		t.Fatalf("the server's report was not taken: %v", err)
	}
	if got := charged(300 * time.Millisecond); !near(got, 0.01) {
		t.Fatalf("server clock: charged %v, want the server's 0.01", got)
	}
	if top := e.TopPatterns(1); len(top) != 1 || !top[0].Server || top[0].ServerMean != 0.01 {
		t.Fatalf("TopPatterns = %+v, want the server's clock", top)
	}
	clk.Advance(time.Minute)
	if got := charged(300 * time.Millisecond); near(got, 0.01) {
		t.Fatalf("after the report lapsed: charged %v, want the client's clock again", got)
	}
}

// TestClientChargesTruedUp: while the server's clock is read, a statement of a pattern the
// server can report (its query identifier is known) that is charged on the client's clock, as
// a pattern's first statements are, is trued up to the server's mean by the pattern's next
// report; one charged while the server's clock was not read, or kept longer than trueUpWithin,
// keeps the client's measurement.
func TestClientChargesTruedUp(t *testing.T) {
	e, clk := newEngine(t, `
server_cores: 1
budgets:
  - {name: r, mode: enforce, server_share: 0.000001, burst_limit: 1000s}
rules:
  - {budget: r, match: {app: r}}
`)
	ctx := tagging.With(context.Background(), "app", "r")
	debt := func() float64 {
		for _, b := range e.Budgets() {
			return b.Snapshot.Debt
		}
		return 0
	}
	identified := func(q string, id int64) uint64 {
		p, _ := e.patterns.Get(q)
		e.model.PutQueryID(p.FingerprintID, p.Normalized, id)
		return p.FingerprintID
	}
	near := func(got, want float64) bool { return math.Abs(got-want) < 1e-3 }
	step := func(what string, want float64, f func()) {
		t.Helper()
		before := debt()
		f()
		if got := debt() - before; !near(got, want) {
			t.Fatalf("%s: the debt moved by %v, want %v", what, got, want)
		}
	}
	report := func(fp uint64, id int64) func() {
		return func() {
			if e.ObserveServer(fp, id, 0.01, clk.Now().Add(time.Minute)) != nil {
				t.Fatal("the report was not taken")
			}
		}
	}
	runs := func(q string) func() {
		return func() {
			if err := run(e, clk, ctx, q, 300*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
	}
	reading := func() { e.Reading(clk.Now().Add(3*time.Second), 2*time.Second) }

	const unread, first, late = "select * from unread where id = $1", "select * from first where id = $1", "select * from late where id = $1"
	fpUnread, fpFirst, fpLate := identified(unread, 1), identified(first, 2), identified(late, 3)
	step("a statement before the server's clock is read", 0.3, runs(unread))
	reading()
	step("its pattern's report", 0, report(fpUnread, 1))

	step("the first statement of a pattern while the server's clock is read", 0.3, runs(first))
	step("its pattern's first report", -0.29, report(fpFirst, 2))
	step("the pattern on the server's clock", 0.01, runs(first))

	reading()
	step("a statement whose pattern the server reports too late", 0.3, runs(late))
	clk.Advance(trueUpWithin)
	step("the report, a minute later", 0, report(fpLate, 3))
	step("the next report of the first pattern", 0, report(fpFirst, 2))
	const lapsed, failed = "select * from lapsed where id = $1", "select * from failed where id = $1"
	fpLapsed, fpFailed := identified(lapsed, 4), identified(failed, 5)
	step("a statement once the reading lapsed", 0.3, runs(lapsed))
	step("its pattern's report", 0, report(fpLapsed, 4))

	reading()
	step("a statement before a read fails", 0.3, runs(failed))
	e.Reading(time.Time{}, 0)
	step("its pattern's report after the failed read", 0, report(fpFailed, 5))

	// A reader that reads once an hour reports every statement too late to true it up: none
	// is kept for it (nor does Finish take the table's lock for it).
	const slow = "select * from slow where id = $1"
	fpSlow := identified(slow, 6)
	e.Reading(clk.Now().Add(10*time.Hour), 2*time.Hour)
	if e.clientCharges.wanted(clk.Now()) {
		t.Fatal("charges wanted for a reader that reports every two hours")
	}
	step("a statement while the server's clock is read once an hour", 0.3, runs(slow))
	step("its pattern's report", 0, report(fpSlow, 6))
}

// TestClientChargesBounded: a full table of kept charges stops keeping them (Finish takes no
// lock for them) until the next Reading, which drops the ones too old to be trued up.
func TestClientChargesBounded(t *testing.T) {
	var c clientCharges
	now := time.Unix(1000, 0)
	c.live.Store(now.Add(time.Hour).UnixNano())
	holds := []budget.Request{{Key: "k"}}
	for range maxClientCharges {
		if !c.wanted(now) {
			t.Fatalf("not wanted with %d of %d kept", c.n, maxClientCharges)
		}
		c.add(1, holds, 0.1, 1, now)
	}
	c.add(1, holds, 0.1, 1, now) // full
	if c.wanted(now) || c.n != maxClientCharges {
		t.Fatalf("full: wanted %v, %d kept", c.wanted(now), c.n)
	}
	e := New(Options{Now: func() time.Time { return now.Add(trueUpWithin) }})
	e.clientCharges.byPattern, e.clientCharges.n = c.byPattern, c.n
	e.Reading(now.Add(trueUpWithin+time.Hour), time.Second)
	if !e.clientCharges.wanted(now.Add(trueUpWithin)) || e.clientCharges.n != 0 {
		t.Fatalf("after the next Reading: wanted %v, %d kept", e.clientCharges.wanted(now.Add(trueUpWithin)), e.clientCharges.n)
	}
}
