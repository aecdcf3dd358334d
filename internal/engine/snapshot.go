package engine

import (
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// BudgetState is one budget's live state.
type BudgetState struct {
	Name string
	Mode string
	budget.Snapshot
}

// Budgets reports every budget in force, in rules-file order.
func (e *Engine) Budgets() []BudgetState {
	st := e.state.Load()
	now := e.now()
	out := make([]BudgetState, 0, len(st.budgets))
	for _, bs := range st.budgets {
		out = append(out, BudgetState{Name: bs.name, Mode: bs.mode.String(), Snapshot: bs.b.Snapshot(now)})
	}
	return out
}

// PatternState is one pattern's learned cost with its normalised text (cut to bounded.QueryLen).
type PatternState struct {
	cost.PatternStats
	FingerprintHex string
	Query          string
}

// TopPatterns returns the n patterns with the most observed executions.
func (e *Engine) TopPatterns(n int) []PatternState {
	top := e.model.Top(e.now(), n)
	out := make([]PatternState, 0, len(top))
	for _, ps := range top {
		s := PatternState{PatternStats: ps}
		if p, ok := e.patterns.ByFingerprint(ps.Fingerprint); ok {
			s.FingerprintHex, s.Query = p.Fingerprint, p.Normalized
		}
		out = append(out, s)
	}
	return out
}
