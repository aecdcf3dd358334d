package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestVolatileRangeScanNotRefusedUnderAuto: under explain: auto (the default), a range scan
// whose cost swings with its argument (10 rows, then 300,000) is explained per call once its
// cost is seen to vary, "per call for patterns whose cost varies widely" (driver/rules). None
// of its calls, the longest a few tens of milliseconds (a second or so on a loaded machine),
// may be refused by a per_query_limit of 20 s. Its first calls were priced by the plan cached
// from the 10-row call, and the k they taught (their mean time over that tiny plan) priced the
// first call explained per call, of its own large plan, at minutes: refused as too costly.
func TestVolatileRangeScanNotRefusedUnderAuto(t *testing.T) {
	const rules = `
budgets:
  - {name: b, mode: enforce, per_query_limit: 20s, explain: auto}
rules:
  - {budget: b, match: {app: scans}}
`
	for _, fe := range openFrontEnds(t, rules, 4) {
		t.Run(fe.name, func(t *testing.T) {
			bg := context.Background()
			for _, q := range []string{
				"drop table if exists volatile_scan",
				"create table volatile_scan (id int primary key, v int)",
				"insert into volatile_scan select g, g from generate_series(1, 300000) g",
				"analyze volatile_scan",
			} {
				if err := fe.exec(bg, q); err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			ctx := tagging.With(bg, "app", "scans")
			refused := 0
			var first error
			for i := range 30 {
				n := 10
				if i%2 == 1 {
					n = 300_000
				}
				err := fe.exec(ctx, "select count(v) from volatile_scan where id <= $1", n)
				var b *driver.BlockedError
				if errors.As(err, &b) {
					refused++
					if first == nil {
						first = err
					}
				} else if err != nil {
					t.Fatal(err)
				}
			}
			if refused > 0 {
				t.Errorf("%d of 30 calls of a range scan (at most a few tens of ms each) refused under per_query_limit 20s; the first: %v",
					refused, first)
			}
		})
	}
}
