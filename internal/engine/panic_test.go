package engine

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// panicObserver panics in the method named by in.
type panicObserver struct{ in string }

func (o *panicObserver) Wants() Wants { return WantSpans | WantDuration | WantDecisions }
func (o *panicObserver) Started(ctx context.Context, _ *Exec) context.Context {
	o.maybe("Started")
	return ctx
}
func (o *panicObserver) Blocked(context.Context, *Exec, error) { o.maybe("Blocked") }
func (o *panicObserver) Finished(context.Context, *Exec, error, time.Duration) {
	o.maybe("Finished")
}
func (o *panicObserver) Decision(string, string, string) { o.maybe("Decision") }
func (o *panicObserver) maybe(method string) {
	if o.in == method {
		panic("observer panics in " + method)
	}
}

// TestObserverPanicReleasesHolds: an observer that panics during a statement (user code, called
// after the statement's admission) leaves nothing held once the panic is recovered: the budget's
// and the engine's in-flight counts are 0 and the next statement of the same (untrained) pattern
// is admitted at once.
func TestObserverPanicReleasesHolds(t *testing.T) {
	for _, method := range []string{"Started", "Decision", "Finished"} {
		t.Run(method, func(t *testing.T) {
			obs := &panicObserver{}
			e, _ := newEngine(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1, server_share: 1, burst_limit: 100s}
rules:
  - {budget: one, match: {app: x}}
`, func(o *Options) { o.Observer = obs })
			ctx := tagging.With(context.Background(), "app", "x")
			obs.in = method
			recovered := func() (r any) {
				defer func() { r = recover() }()
				x := new(Exec)
				if _, err := e.Begin(ctx, x, nil, "select * from orders where id = $1", nil); err != nil {
					return err
				}
				x.Finish(ctx, nil)
				return nil
			}()
			if want := "observer panics in " + method; fmt.Sprint(recovered) != want {
				t.Fatalf("recovered %v, want the observer's panic", recovered)
			}
			if got := e.Budgets()[0].InFlight; got != 0 {
				t.Fatalf("budget in flight %d after a panic in %s, want 0", got, method)
			}
			if got := e.InFlight(); got != 0 {
				t.Fatalf("engine in flight %d after a panic in %s, want 0", got, method)
			}
			obs.in = ""
			x, err := begin(e, ctx, "select * from orders where id = $1")
			if err != nil {
				t.Fatalf("next statement after a panic in %s: %v", method, err)
			}
			x.Finish(ctx, nil)
		})
	}
}

func (*panicObserver) BatchFinished(context.Context, *Batch, error, time.Duration) {}
