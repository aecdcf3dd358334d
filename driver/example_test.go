package driver_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log"

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
