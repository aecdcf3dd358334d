package driver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// A typo in a rules file is an error naming the line and the field, never silently ignored.
func ExampleParseConfig() {
	_, err := driver.ParseConfig([]byte(`
budgets:
  - name: reporting
    mode: enforce
    max_concurent: 4
`))
	fmt.Println(err)
	// Output: pgtraffic: rules line 5: budgets[0].max_concurent: unknown field (did you mean max_concurrent?)
}

// Open a database whose reporting traffic is limited by a budget, and tell a blocked statement
// from any other error.
func ExampleOpen() {
	cfg, err := driver.ParseConfig([]byte(`
budgets:
  - {name: reporting, mode: enforce, max_concurrent: 4, per_query_limit: 2s}
rules:
  - {budget: reporting, match: {app: reporting}}
`))
	if err != nil {
		log.Fatal(err)
	}
	db, err := driver.Open("postgres://app@localhost/shop", driver.WithConfig(cfg))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()

	ctx := tagging.With(context.Background(), "app", "reporting")
	var total float64
	err = db.QueryRowContext(ctx, "select sum(amount) from orders").Scan(&total)
	var blocked *driver.BlockedError
	switch {
	case errors.As(err, &blocked):
		log.Printf("over budget %s (%s); retry in %v", blocked.Budget, blocked.Reason, blocked.RetryAfter)
	case err != nil:
		log.Fatal(err)
	}
}

// Batch jobs ask before each chunk instead of being refused half-way.
func ExampleConnector_Wait() {
	c, err := driver.NewConnector("postgres://app@localhost/shop", driver.WithRulesFile("/etc/pgtraffic/rules.yaml"))
	if err != nil {
		log.Fatal(err)
	}
	db := sql.OpenDB(c)
	defer db.Close()
	ctx := tagging.With(context.Background(), "job", "import")
	for chunk := range 10 {
		if err := c.Wait(ctx); err != nil { // backs off with jitter while the budget is throttled
			log.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "insert into items select g from generate_series($1::int, $1::int + 999) g", chunk*1000); err != nil {
			log.Fatal(err)
		}
	}
}

// Build the rules in code with the exported modes. Creating the connector checks the rules and
// connects to nothing: database/sql opens connections on the first statement.
func ExampleNewConnector() {
	cfg := &driver.Config{
		ServerCores: 8, // the server sustains 8 execution seconds per second
		Budgets: []driver.Budget{{
			Name:          "reporting",
			Mode:          driver.ModeEnforce,
			MaxConcurrent: new(4),
			ServerShare:   new(float64(0.25)), // 2 of the 8 cores, on average
			MaxWait:       driver.Duration(500 * time.Millisecond),
		}},
		Rules: []driver.Rule{{Budget: "reporting", Match: map[string]string{"app": "reporting"}}},
		Guards: driver.Guards{
			RequireWhere: driver.Guard{Mode: driver.ModeEnforce}, // no UPDATE or DELETE of every row
		},
	}
	c, err := driver.NewConnector("postgres://app@localhost/shop", driver.WithConfig(cfg))
	if err != nil {
		log.Fatal(err) // a mistake in the rules, naming the field
	}
	db := sql.OpenDB(c)
	defer db.Close() // also stops what the connector started

	for _, b := range c.Snapshot().Budgets {
		fmt.Printf("%s: %s, burst_limit %gs\n", b.Name, b.Mode, b.Burst)
	}
	// Output: reporting: enforce, burst_limit 2s
}

// A blocked statement comes back as a *BlockedError, usually wrapped by the caller's own errors.
// Nothing was sent to the server, so it is safe to retry after RetryAfter; a zero RetryAfter
// means that waiting cannot help (a per_query_limit or a guard refused the statement).
func ExampleBlockedError() {
	handle := func(err error) {
		var blocked *driver.BlockedError
		switch {
		case errors.As(err, &blocked) && blocked.RetryAfter > 0:
			fmt.Printf("budget %s is full (%s); retry in %v\n", blocked.Budget, blocked.Reason, blocked.RetryAfter)
		case errors.As(err, &blocked):
			fmt.Printf("refused by %s (%s: %s); do not retry\n", blocked.Budget, blocked.Reason, blocked.Limit)
		case err != nil:
			fmt.Println("failed:", err)
		}
	}
	// What a query returns when its budget has no slot free, and when a guard refuses it.
	handle(fmt.Errorf("monthly report: %w", &driver.BlockedError{
		Budget: "reporting", Rule: "app=reporting", Reason: driver.ReasonConcurrency,
		Limit: "max_concurrent=4", RetryAfter: 200 * time.Millisecond}))
	handle(&driver.BlockedError{Budget: "require_where", Rule: "require_where", Reason: driver.ReasonGuard,
		Limit: "UPDATE or DELETE without a WHERE that restricts rows"})
	// Output:
	// budget reporting is full (concurrency); retry in 200ms
	// refused by require_where (guard: UPDATE or DELETE without a WHERE that restricts rows); do not retry
}
