package engine

import (
	"context"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestGuardUnparsableSaysSo: a guard that refuses a text pg_query cannot parse says that is why
// (the statement may well have a WHERE); a parsed statement gets the guard's own limit text.
func TestGuardUnparsableSaysSo(t *testing.T) {
	e, clk := newEngine(t, `
guards:
  require_where: enforce
  block_truncate: enforce
`)
	ctx := context.Background()
	const unparsable = "statement pgtraffic cannot parse that may hold an UPDATE, DELETE, MERGE or TRUNCATE"
	for _, tc := range []struct {
		q, guard, limit string
	}{
		// With standard_conforming_strings off the server reads '\'' as a quote in a string.
		{`DELETE FROM t WHERE '\'' = ''''`, vocab.GuardRequireWhere, unparsable},
		{`TRUNCATE t; SELECT '\'' = ''''`, vocab.GuardBlockTruncate, unparsable},
		{`DELETE FROM t`, vocab.GuardRequireWhere, "UPDATE or DELETE without a WHERE that restricts rows"},
		{`TRUNCATE t`, vocab.GuardBlockTruncate, "TRUNCATE"},
	} {
		d := denial(t, run(e, clk, ctx, tc.q, time.Millisecond))
		if d.Reason != vocab.ReasonGuard || d.Rule != tc.guard || d.Limit != tc.limit {
			t.Errorf("%q: %+v; want guard %s, limit %q", tc.q, d, tc.guard, tc.limit)
		}
	}
}
