package engine_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
)

// A front end's statement: Begin, send only when admitted, Finish once with the outcome (here the
// statement is not really sent: conn is nil, so no EXPLAIN runs either).
func ExampleEngine_Begin() {
	e := engine.New(engine.Options{})
	cfg, err := rules.Parse([]byte(`
budgets:
  - {name: one, mode: enforce, max_concurrent: 1}
rules:
  - {budget: one, match: {statement: select}}
`))
	if err != nil {
		panic(err)
	}
	r, err := e.Compile(cfg) // what the runtime does with each rules file
	if err != nil {
		panic(err)
	}
	e.Install(r)
	ctx := context.Background()
	var conn engine.Conn          // the statement's own connection, for EXPLAIN (nil: none)
	var first, second engine.Exec // a front end keeps one per connection and reuses it

	// The statement runs under the context Begin returns (it carries the observer's span) and
	// is finished with it.
	firstCtx, err := e.Begin(ctx, &first, conn, "select * from orders where id = $1", []any{42})
	if err != nil {
		panic(err)
	}
	fmt.Println(first.Decision, first.Budgets, first.Pattern.Normalized)

	// While the first holds the budget's only slot, a second statement is refused: nothing may
	// be sent, and it needs no Finish.
	_, err = e.Begin(ctx, &second, conn, "select 1", nil)
	var d *engine.Denial
	fmt.Println(errors.As(err, &d), d.Budget, d.Reason)

	first.Finish(firstCtx, nil) // the first statement completed: its slot is given back
	fmt.Println(e.Budgets()[0].InFlight)
	// Output:
	// allow [one] select * from orders where id = $1
	// true one concurrency
	// 0
}
