package engine

import (
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
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

// PatternState is one pattern's learned cost (with its normalised text, cut to bounded.QueryLen)
// and its fingerprint in hex.
type PatternState struct {
	cost.PatternStats
	FingerprintHex string
}

// TopPatterns returns the n patterns with the most observed executions, with the text the
// cost model keeps beside their statistics (a pattern cache may have evicted a pattern that
// still runs: the text cache answers its statements without it).
func (e *Engine) TopPatterns(n int) []PatternState {
	top := e.model.Top(e.now(), n)
	out := make([]PatternState, 0, len(top))
	for _, ps := range top {
		out = append(out, PatternState{PatternStats: ps, FingerprintHex: vocab.FingerprintHex(ps.Fingerprint)})
	}
	return out
}
