package coord

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// After Close, the background reading of the secret stops: no further calls.
func TestSecretReadingStopsAtClose(t *testing.T) {
	srv := redistest.Need(t)
	var calls atomic.Int32
	e, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: "a", Database: electDB,
		Secret: func(ctx context.Context) (string, error) {
			calls.Add(1)
			return "", errors.New("refused")
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := e.Elect(ctx, health.Ballot{Set: "s", Interval: time.Second}); !errors.Is(err, health.ErrNotReady) {
		t.Fatalf("Elect: %v", err)
	}
	e.Close()
	n := calls.Load()
	time.Sleep(2500 * time.Millisecond)
	if m := calls.Load(); m != n {
		t.Errorf("secret read %d more times after Close", m-n)
	}
	if _, err := e.Elect(context.Background(), health.Ballot{Set: "s", Interval: time.Second}); err == nil {
		t.Error("Elect after Close with no key succeeded")
	}
}

// Concurrent votes and publications of several sets on two instances, under -race.
func TestElectionConcurrent(t *testing.T) {
	srv := redistest.Need(t)
	es := []*Election{newElection(t, srv, "a", electDB), newElection(t, srv, "b", electDB)}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			e := es[i%2]
			b := health.Ballot{Set: []string{"x", "y"}[i/2%2], Interval: 50 * time.Millisecond}
			for j := 0; j < 30; j++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				v, err := e.Elect(ctx, b)
				if err == nil && v.Lead {
					_ = e.Publish(ctx, b, []health.Shared{{Metric: "active_queries", Value: 1}})
				}
				if err == nil && v.Bad != "" {
					t.Errorf("bad vote: %+v", v)
				}
				cancel()
			}
		}(i)
	}
	wg.Wait()
}
