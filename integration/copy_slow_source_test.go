package integration

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/driver"
)

// slowSource yields rows slowly (a producer streaming from elsewhere) and records when it
// was last asked for a row.
type slowSource struct {
	rows, i int
	sleep   time.Duration
	calls   atomic.Int64
	last    atomic.Int64 // unix nanos of the last Next
}

func (s *slowSource) Next() bool {
	s.calls.Add(1)
	s.last.Store(time.Now().UnixNano())
	time.Sleep(s.sleep)
	s.i++
	return s.i <= s.rows
}
func (s *slowSource) Values() ([]any, error) { return []any{s.i, "x"}, nil }
func (s *slowSource) Err() error             { return nil }

// TestCopyFromSlowSourceCutAtMaxDuration: README, "`max_duration` on a budget cancels an admitted
// statement that runs too long" and "It bounds a statement from its admission". A CopyFrom whose
// source produces rows slowly (60 rows, 50 ms each: 3 s) under a budget with max_duration 300ms
// must be cut near 300 ms: its call should return, its source stop being read, and the budget's
// only slot come back. (pgx reads a source to its end before it notices its context ended:
// without pgtraffic stopping the source, the copy ran to the source's end, ~3 s, holding the
// slot the whole time, and only then reported ErrOverrun.)
func TestCopyFromSlowSourceCutAtMaxDuration(t *testing.T) {
	p, _ := openPool(t, `budgets:
  - {name: loads, mode: enforce, max_concurrent: 1, max_duration: 300ms}
rules:
  - {budget: loads, match: {statement: copy, table: items}}
`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int, name text)"); err != nil {
		t.Fatal(err)
	}
	const rows, each = 60, 50 * time.Millisecond
	src := &slowSource{rows: rows, sleep: each}
	start := time.Now()
	done := make(chan error, 1)
	var took time.Duration
	go func() {
		_, err := p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, src)
		took = time.Since(start)
		done <- err
	}()
	// Well past max_duration (5×): the copy should have been cut and its slot given back.
	time.Sleep(1500 * time.Millisecond)
	second := p.Snapshot()
	var inFlight int
	for _, b := range second.Budgets {
		if b.Name == "loads" {
			inFlight = b.InFlight
		}
	}
	err := <-done
	if !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("copy past max_duration: %v, want ErrOverrun", err)
	}
	readAfter := time.Duration(src.last.Load()-start.UnixNano()) - 300*time.Millisecond
	t.Logf("copy returned after %v (source %v in all); source asked for %d of %d rows, the last %v after max_duration; budget in flight 1.2 s after max_duration: %d",
		took.Round(time.Millisecond), rows*each, src.calls.Load(), rows+1, readAfter.Round(time.Millisecond), inFlight)
	if took > rows*each/2 || inFlight != 0 || src.calls.Load() > rows/2 {
		t.Fatalf("a copy under max_duration=300ms ran %v (its source's whole %v) and held its slot 1.2 s past the bound (in_flight %d): not cut at max_duration",
			took.Round(time.Millisecond), rows*each, inFlight)
	}
}
