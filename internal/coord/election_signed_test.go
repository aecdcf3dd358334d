package coord

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// TestElectionSignedCrossDatabaseReplay: two databases of one cluster share the key; a sample of
// one copied into the other's key is not read.
func TestElectionSignedCrossDatabaseReplay(t *testing.T) {
	srv := redistest.Need(t)
	ctx := context.Background()
	ballot := health.Ballot{Set: "review-x", Interval: time.Second}
	const other = "app@db.example.com:5432/billing"
	a := newElection(t, srv, "a", other)
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("%+v", v)
	}
	if err := a.Publish(ctx, ballot, []health.Shared{{Metric: "active_queries", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	rc := newClient(t, srv)
	_, from := ElectionKeys(other, ballot.Set)
	lease, to := ElectionKeys(electDB, ballot.Set)
	kept, _ := rc.HGetAll(ctx, from).Result()
	rc.Set(ctx, lease, "mallory", time.Second)
	rc.HSet(ctx, to, kept)
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if v, err := newElection(t, srv, "b", electDB).Elect(ectx, ballot); !errors.Is(err, ErrUnsigned) {
		t.Errorf("another database's sample: %+v, %v; want ErrUnsigned", v, err)
	}
}

// TestElectionSignedOldVersionLead: a lead of the previous version (at = publication, no sig):
// the new follower does not read it.
func TestElectionSignedOldVersionLead(t *testing.T) {
	srv := redistest.Need(t)
	ctx := context.Background()
	ballot := health.Ballot{Set: "review-old", Interval: time.Second}
	rc := newClient(t, srv)
	lease, sample := ElectionKeys(electDB, ballot.Set)
	now, _ := rc.Time(ctx).Result()
	rc.Set(ctx, lease, "old", time.Second)
	rc.HSet(ctx, sample, "at", strconv.FormatInt(now.UnixMicro(), 10), "data", `{"f":1,"r":[{"m":"active_queries","v":"0","a":0}]}`)
	ectx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if v, err := newElection(t, srv, "b", electDB).Elect(ectx, ballot); !errors.Is(err, ErrUnsigned) {
		t.Errorf("old lead's sample: %+v, %v; want ErrUnsigned", v, err)
	}
}

// TestElectionSignedRegainedLeaseDate: a lead that lost the lease and won it again signs with the
// date of the round it won last, not the first.
func TestElectionSignedRegainedLeaseDate(t *testing.T) {
	srv := redistest.Need(t)
	ctx := context.Background()
	ballot := health.Ballot{Set: "review-regain", Interval: 100 * time.Millisecond}
	a, b := newElection(t, srv, "a", electDB), newElection(t, srv, "b", electDB)
	elect(t, a, ballot)
	if err := a.Resign(ctx, ballot); err != nil {
		t.Fatal(err)
	}
	if v := elect(t, b, ballot); !v.Lead {
		t.Fatalf("%+v", v)
	}
	time.Sleep(time.Second)
	b.Resign(ctx, ballot)
	if v := elect(t, a, ballot); !v.Lead {
		t.Fatalf("%+v", v)
	}
	a.Publish(ctx, ballot, []health.Shared{{Metric: "active_queries", Value: 0}})
	v := elect(t, b, ballot)
	if len(v.Published) != 1 || v.Published[0].Age > 100*time.Millisecond {
		t.Errorf("after regaining the lease: %+v", v)
	}
}

// TestElectionSignedCloseEndsSecretRead: Close ends a secret read in progress.
func TestElectionSignedCloseEndsSecretRead(t *testing.T) {
	srv := redistest.Need(t)
	done := make(chan struct{})
	e, err := NewElection(ElectionOptions{Client: newClient(t, srv), Instance: "a", Database: electDB,
		Secret: func(ctx context.Context) (string, error) {
			<-ctx.Done()
			close(done)
			return "", ctx.Err()
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := e.Elect(ctx, health.Ballot{Set: "s", Interval: time.Second}); !errors.Is(err, health.ErrNotReady) {
		t.Fatal(err)
	}
	e.Close()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Error("the secret's read outlived Close")
	}
}
