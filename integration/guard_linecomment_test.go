package integration

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestRequireWhereUnparsedAfterLineComment: an enforced require_where refuses a write that
// pg_query is not given (README: "An enforced guard also refuses a write pg_query cannot
// parse"), here an UPDATE without a WHERE nested 1,500 operators deep, which the server runs.
// After a line comment whose last word is "for", "do" or "key" it must be refused as well:
// the newline is the only space between that word and UPDATE, and the guard's word scan took
// them for FOR UPDATE, DO UPDATE and NO KEY UPDATE, which write no rows of their own.
func TestRequireWhereUnparsedAfterLineComment(t *testing.T) {
	raw, db, _ := openBoth(t, driver.WithConfig(guardRules(t)))
	ctx := context.Background()
	if _, err := raw.ExecContext(ctx, `create table acct (id int primary key, bal int);
		insert into acct select g, 100 from generate_series(1, 5) g`); err != nil {
		t.Fatal(err)
	}
	upd := "update acct set bal = 0" + strings.Repeat("+0", 1500)
	if n := wouldWrite(t, raw, "", upd); n != 5 {
		t.Fatalf("the server wrote %d rows with the update, want 5: the test needs an update it runs", n)
	}
	for _, q := range []string{
		upd,
		"select 1; -- reset the balances for\n" + upd,
		"select 1; -- what we do\n" + upd,
		"select 1; -- by key\n" + upd,
		"with c as (select 1) -- for\n" + upd,
	} {
		if _, err := db.ExecContext(ctx, q); !errors.Is(err, driver.ErrBlocked) {
			t.Errorf("%.50q…: %v, want refused by require_where", q, err)
		}
	}
	var zeroed int
	if err := raw.QueryRowContext(ctx, "select count(*) from acct where bal = 0").Scan(&zeroed); err != nil {
		t.Fatal(err)
	}
	if zeroed != 0 {
		t.Errorf("%d of 5 rows zeroed by updates without a WHERE under an enforced require_where", zeroed)
	}
}
