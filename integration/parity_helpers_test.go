package integration

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
)

// parityAdmitAll is an enforce budget that admits every statement of the test's role, and
// prices each one with an EXPLAIN (explain: call) on its connection.
const parityAdmitAll = `budgets:
  - {name: all, mode: enforce, max_concurrent: 1000, server_share: 1, burst_limit: 1h, per_query_limit: 1h, explain: call}
rules:
  - {budget: all, match: {username: postgres}}
`

// parityErr describes an error by what a pgx user tests of it.
func parityErr(err error) string {
	if err == nil {
		return "nil"
	}
	var b strings.Builder
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		fmt.Fprintf(&b, "pg:%s", pg.Code)
	}
	for _, e := range []struct {
		n string
		e error
	}{{"norows", pgx.ErrNoRows}, {"txclosed", pgx.ErrTxClosed}, {"canceled", context.Canceled},
		{"deadline", context.DeadlineExceeded}, {"blocked", driver.ErrBlocked}} {
		if errors.Is(err, e.e) {
			fmt.Fprintf(&b, "|%s", e.n)
		}
	}
	if pgconn.Timeout(err) {
		b.WriteString("|timeout")
	}
	if b.Len() == 0 {
		return "other:" + err.Error()
	}
	return b.String()
}
