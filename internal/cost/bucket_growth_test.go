package cost

import (
	"math"
	"testing"
)

// TestOneSlowSampleAfterGrowth: a pattern with a long, steady history whose table grows past a
// power of two of plan cost has one slow execution there (its caller read the rows slowly).
// The new range's one sample must not outweigh the neighbouring range's full history: the
// prediction stays near what the history says (about 9ms here), not that one run's second,
// which a per_query_limit would refuse until the next probe. Once the new range has as many
// samples as its neighbour, it is the one used.
func TestOneSlowSampleAfterGrowth(t *testing.T) {
	m := NewModel(testPatterns)
	const fp = 1
	const k = 6.5e-3 / 1943 // seconds per plan cost unit of its history
	for range 20 {
		m.Observe(fp, "select ...", 1943, 1943*k, true, 1)
	}
	m.Observe(fp, "select ...", 2642, 1.0, true, 1) // one slow run in the grown range
	if s, _ := predict(m, fp, 2642); math.Abs(s-2642*k) > 2642*k/2 {
		t.Fatalf("after one slow run in the grown range: predicted %.4fs, want about %.4fs", s, 2642*k)
	}
	for range 5 {
		m.Observe(fp, "select ...", 2642, 2642*k*2, true, 1) // the grown range is twice as slow per unit
	}
	if s, _ := predict(m, fp, 2642); math.Abs(s-2642*k*2) > 2642*k/2 {
		t.Fatalf("with the grown range's own history: predicted %.4fs, want about %.4fs", s, 2642*k*2)
	}
}
