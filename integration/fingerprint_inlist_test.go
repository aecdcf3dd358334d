package integration

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestBlockByFingerprintCatchesEveryInListLength: the incident runbook blocks a report by the
// fingerprint of one call's text (as pg_stat_activity shows it). Generated SQL varies its IN
// list's length with its input, and a report commonly groups or orders by position: every call
// of the report, whatever its list's length, must be refused. Before, a text with GROUP BY 1
// was fingerprinted by its tokens, each list length a pattern of its own, and the block caught
// one call in twelve.
func TestBlockByFingerprintCatchesEveryInListLength(t *testing.T) {
	list := func(n int) string {
		items := make([]string, n)
		for i := range items {
			items[i] = "'r" + strconv.Itoa(i) + "'"
		}
		return strings.Join(items, ", ")
	}
	for _, report := range []string{
		"select region, count(*) from orders where region in (%s) group by 1",
		"select id, region from orders where region = any(array[%s]) order by 2 desc limit 5",
	} {
		t.Run(report[:strings.Index(report, " from")], func(t *testing.T) {
			fp := driver.Fingerprint(fmt.Sprintf(report, list(3)))
			p, _ := openPool(t, fmt.Sprintf(`
budgets:
  - {name: incident-block, mode: enforce, max_concurrent: 0}
rules:
  - {budget: incident-block, match: {fingerprint: %s}}
`, fp))
			ctx := tagging.With(context.Background(), "app", "reports")
			if _, err := p.Exec(ctx, "create table orders (id int primary key, region text)"); err != nil {
				t.Fatal(err)
			}
			var ran []int
			for n := 1; n <= 12; n++ {
				rows, err := p.Query(ctx, fmt.Sprintf(report, list(n)))
				if err == nil {
					rows.Close()
					ran = append(ran, n)
					continue
				}
				var be *driver.BlockedError
				if !errors.As(err, &be) {
					t.Fatalf("%d items: %v", n, err)
				}
			}
			if len(ran) > 0 {
				t.Errorf("the report blocked by the fingerprint of its 3-item call (%s) ran with %v items", fp, ran)
			}
		})
	}
}
