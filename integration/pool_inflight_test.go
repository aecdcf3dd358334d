package integration

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/driver"
)

// throttle_when: {in_flight: 2} admits nothing while two statements are in flight. A pool
// statement is admitted before it has a connection, and counts in in_flight only once it has
// one: with every connection held by uncontrolled work, six statements arriving one after the
// other would each find nothing in flight and all be admitted, to run together once the
// connections come back. Those admitted and still waiting for a connection count against the
// threshold too: two are admitted, the other four refused, and no more than two run at once.
// (The statements arrive 50 ms apart: in_flight is read when a statement is decided, and
// statements decided at the same moment do not see each other; README, Known limitations.)
func TestPoolThrottleInFlightCountsPending(t *testing.T) {
	p := pendingPool(t, 6, `budgets: [{name: b, mode: enforce, throttle_when: {in_flight: 2}}]
rules: [{budget: b, match: {app: x}}]
`)
	ctx := pendingCtx
	// Uncontrolled work holds every connection for a moment.
	var raws []*pgxpool.Conn
	for range 6 {
		c, err := p.Raw().Acquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		raws = append(raws, c)
	}
	var wg sync.WaitGroup
	var blocked atomic.Int64
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := p.Exec(ctx, "select pg_sleep(0.6)")
			var be *driver.BlockedError
			if errors.As(err, &be) {
				blocked.Add(1)
			} else if err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	for _, c := range raws {
		c.Release()
	}
	peak := int64(0)
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := p.Snapshot().InFlight; n > peak {
				peak = n
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	wg.Wait()
	close(stop)
	<-polled
	t.Logf("peak in_flight %d, refused %d", peak, blocked.Load())
	if peak > 2 || blocked.Load() != 4 {
		t.Errorf("throttle_when in_flight: 2: %d of the pool's statements ran at once and %d of 6 were refused; want at most 2 and 4 "+
			"(the statements admitted while waiting for a connection count)", peak, blocked.Load())
	}
	poolHoldsNothing(t, p, "throttle")
}
