package engine

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// startedKey is the key under which ctxObserver's Started puts its statement.
type startedKey struct{}

// ctxObserver keeps its per-statement state in the context its Started returns, as a pgx
// tracer does, and records whether each Finished got its own statement's state back.
type ctxObserver struct {
	recObserver
	started, matched, unmatched int
}

func (o *ctxObserver) Started(ctx context.Context, x *Exec) context.Context {
	o.started++
	return context.WithValue(ctx, startedKey{}, x)
}

func (o *ctxObserver) Finished(ctx context.Context, x *Exec, _ error, _ time.Duration) {
	if got, _ := ctx.Value(startedKey{}).(*Exec); got == x {
		o.matched++
	} else {
		o.unmatched++
	}
}

func (o *ctxObserver) Wants() Wants { return WantSpans | WantDuration }

// TestObserverContextTravels: what the observer's Started returns comes back to its Finished,
// for its own statement: through the front end for a statement (Begin returns it, Finish takes
// it, an abandoned statement's Abandon too), and kept by the batch for each of its statements.
func TestObserverContextTravels(t *testing.T) {
	obs := &ctxObserver{}
	e, _ := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 5}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
	ctx := tagging.With(context.Background(), "app", "x")

	x := new(Exec)
	sctx, err := e.Begin(ctx, x, nil, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := sctx.Value(startedKey{}).(*Exec); got != x {
		t.Fatal("Begin did not return the context the observer's Started returned")
	}
	x.Finish(sctx, nil)

	sctx, err = e.BeginBeforeConn(ctx, x, "select 2", nil)
	if err != nil {
		t.Fatal(err)
	}
	x.Abandon(sctx, errors.New("no connection"))

	var b Batch
	if err := e.BeginBatch(ctx, &b, nil, []string{"select 1", "select 2", "select 3"}, nil); err != nil {
		t.Fatal(err)
	}
	b.Finish(ctx, nil)
	if err := e.BeginBatchBeforeConn(ctx, &b, []string{"select 1", "select 2"}, nil); err != nil {
		t.Fatal(err)
	}
	b.Abandon(ctx, errors.New("no connection"))

	if obs.started != 7 || obs.matched != 7 || obs.unmatched != 0 {
		t.Fatalf("started %d, finished with their own context %d, with another %d; want 7, 7, 0",
			obs.started, obs.matched, obs.unmatched)
	}
	for i := range b.ctxs {
		if b.ctxs[i] != nil {
			t.Fatalf("the batch keeps statement %d's context after its end", i)
		}
	}
}

func (*ctxObserver) BatchFinished(context.Context, *Batch, error, time.Duration) {}
