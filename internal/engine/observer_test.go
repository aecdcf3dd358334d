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

// spanObserver counts the spans a real observer would begin (Started and Blocked of a decision
// that resumes nothing) and end (Finished, Blocked), and checks that a resumed decision is
// handed the context its statement's span was begun in.
type spanObserver struct {
	recObserver
	begun, ended, resumedElsewhere int
}

type spanKey struct{}

func (o *spanObserver) Wants() Wants { return WantSpans | WantDuration }

func (o *spanObserver) span(ctx context.Context, x *Exec) context.Context {
	if !x.Resumed {
		o.begun++
		return context.WithValue(ctx, spanKey{}, x)
	}
	if ctx.Value(spanKey{}) != x {
		o.resumedElsewhere++
	}
	return ctx
}

func (o *spanObserver) Started(ctx context.Context, x *Exec) context.Context { return o.span(ctx, x) }

func (o *spanObserver) Blocked(ctx context.Context, x *Exec, _ error) {
	o.span(ctx, x)
	o.ended++
}

func (o *spanObserver) Finished(context.Context, *Exec, error, time.Duration) { o.ended++ }

func (*spanObserver) BatchFinished(context.Context, *Batch, error, time.Duration) {}

// TestDecidedAgainContinuesItsSpan: a statement of the pool admitted before its connection,
// overtaken, and held back by health once it has it, is decided again before a connection
// (Acquired's ErrWaitBeforeConn, then Abandon): one statement, so one span, begun at its
// first decision and ended once, at its end; its next decision continues it, whether it is
// admitted or refused.
func TestDecidedAgainContinuesItsSpan(t *testing.T) {
	for _, refused := range []bool{false, true} {
		obs := &spanObserver{}
		e, clk := newEngine(t, `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1, max_wait: 10s, throttle_when: {in_flight: 2}}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
		ctx := tagging.With(context.Background(), "app", "x")
		pooled := new(Exec)
		pctx, err := e.BeginBeforeConn(ctx, pooled, "select 1", nil)
		if err != nil {
			t.Fatal(err)
		}
		running, err := begin(e, ctx, "select 2") // overtakes its pending slot
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- pooled.Acquired(pctx) }()
		if err = answered(t, clk, done); !errors.Is(err, ErrWaitBeforeConn) {
			t.Fatalf("Acquired held back for health: %v, want ErrWaitBeforeConn", err)
		}
		pooled.Abandon(pctx, err)
		if obs.ended != 0 {
			t.Fatalf("%d spans ended when the statement was sent to be decided again", obs.ended)
		}
		dctx := ctx
		if refused {
			var cancel context.CancelFunc
			dctx, cancel = context.WithCancel(ctx)
			cancel() // refused for its slot at once: its context ended
		}
		go func() {
			var err error
			pctx, err = e.BeginBeforeConn(dctx, pooled, "select 1", nil)
			done <- err
		}()
		if !refused {
			waiting(t, clk, done) // for the running statement's slot
			running.Finish(ctx, nil)
		}
		err = <-done
		if refused != (err != nil) {
			t.Fatalf("decided again: %v (want refused: %v)", err, refused)
		}
		if !refused {
			if err := pooled.Acquired(pctx); err != nil {
				t.Fatal(err)
			}
			pooled.Finish(pctx, nil)
		} else {
			running.Finish(ctx, nil)
		}
		// The running statement's span, and the pooled statement's one.
		if obs.begun != 2 || obs.ended != 2 || obs.resumedElsewhere != 0 {
			t.Errorf("refused %v: %d spans begun, %d ended, %d decisions resumed without their span; want 2, 2, 0",
				refused, obs.begun, obs.ended, obs.resumedElsewhere)
		}
	}
}
