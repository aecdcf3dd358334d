package guard

import "testing"

// TestMergeComplementaryWhenClauses: require_where exists to catch a write that touches
// every row of its table; for MERGE the classic mistake is an ON condition without the join key
// (ON s.batch = 7), which matches every target row. README's FAQ: a MERGE "passes only if its
// condition references a target column in a way that can be false for some row", and
// "x IS NULL OR x IS NOT NULL" is refused. The WHEN MATCHED clauses below split the matched rows
// into complementary halves, one updated and one deleted, so every row of t is written, exactly
// as by the single clause "WHEN MATCHED AND (t.deleted_at IS NULL OR t.deleted_at IS NOT NULL)
// THEN DELETE" or by an unconditioned "WHEN MATCHED THEN DELETE" after the UPDATE, both of
// which the guard refuses. A user expects the same rows written to get the same verdict.
func TestMergeComplementaryWhenClauses(t *testing.T) {
	const refused = "MERGE INTO t USING src s ON s.batch = 7 " +
		"WHEN MATCHED AND t.deleted_at IS NULL THEN UPDATE SET v = s.v WHEN MATCHED THEN DELETE"
	if !facts(refused).UnsafeWrite {
		t.Fatalf("%q is not refused: the comparison below needs it refused", refused)
	}
	for _, sql := range []string{
		"MERGE INTO t USING src s ON s.batch = 7 " +
			"WHEN MATCHED AND t.deleted_at IS NULL THEN UPDATE SET v = s.v " +
			"WHEN MATCHED AND t.deleted_at IS NOT NULL THEN DELETE",
		"MERGE INTO t USING src s ON s.batch = 7 " +
			"WHEN MATCHED AND t.v < s.v THEN UPDATE SET v = s.v " +
			"WHEN MATCHED AND t.v >= s.v THEN DELETE",
	} {
		if f := facts(sql); !f.UnsafeWrite {
			t.Errorf("%q: UnsafeWrite=false, want true (its WHEN MATCHED clauses together write every matched row, and ON matches every row)", sql)
		}
	}
}
