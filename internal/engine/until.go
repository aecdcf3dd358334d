package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// A rule with until lapses by itself: from that time it selects nothing, with no reload and no
// timer. The rules are compiled once; a statement skips a lapsed rule when it routes, and a
// route saved for a text (texts.go) is used only before the next until after it was made.

// RuleExpiry is a rule with an until, for the status.
type RuleExpiry struct {
	Rule   string    `json:"rule"`   // its match, "app=reporting,controller=export"
	Budget string    `json:"budget"` // the budget it selects
	Until  time.Time `json:"until"`  // when it lapses; it may have passed
}

// expiry holds the until times of compiled rules. Its zero value is rules that never lapse.
type expiry struct {
	until    []time.Time  // rule index -> its until (zero: none); nil when no rule has one
	lapses   []time.Time  // the distinct until times, ascending
	expiries []RuleExpiry // the rules with an until, in file order
}

// compileExpiry records the until times of rs, whose rules st's ruleName and ruleBudget list.
func (st *compiled) compileExpiry(rs []rules.Rule) {
	for i := range rs {
		u := rs[i].Until
		if u.IsZero() {
			continue
		}
		if st.until == nil {
			st.until = make([]time.Time, len(rs))
		}
		st.until[i] = u
		st.lapses = append(st.lapses, u)
		st.expiries = append(st.expiries, RuleExpiry{Rule: st.ruleName[i], Budget: st.budgets[st.ruleBudget[i]].name, Until: u})
	}
	slices.SortFunc(st.lapses, time.Time.Compare)
	st.lapses = slices.CompactFunc(st.lapses, time.Time.Equal)
}

// lapsed reports whether rule r has lapsed at now.
func (st *compiled) lapsed(r int, now time.Time) bool {
	return st.until != nil && !st.until[r].IsZero() && !now.Before(st.until[r])
}

// nextLapse returns the first until after now, or zero when no rule lapses after now.
func (st *compiled) nextLapse(now time.Time) time.Time {
	i, _ := slices.BinarySearchFunc(st.lapses, now, func(u, now time.Time) int {
		if u.After(now) {
			return 1
		}
		return -1
	})
	if i == len(st.lapses) {
		return time.Time{}
	}
	return st.lapses[i]
}

// RuleExpiries returns the rules in force that have an until, in rules-file order, lapsed
// ones included.
func (e *Engine) RuleExpiries() []RuleExpiry {
	return slices.Clone(e.state.Load().expiries)
}

// warnLapsed logs a warning when rules of cfg have lapsed at now: such a file is valid (an
// emergency's rules left behind) but they do nothing, which their author may not expect (an
// until written in local time taken for UTC, in the past already). It names them by their
// place in the file.
func warnLapsed(log *slog.Logger, cfg *rules.Config, now time.Time) {
	var lapsed []string
	for i := range cfg.Rules {
		if cfg.Rules[i].Lapsed(now) {
			lapsed = append(lapsed, fmt.Sprintf("rules[%d]", i))
		}
	}
	switch {
	case len(lapsed) == 0:
	case len(lapsed) == len(cfg.Rules):
		log.Warn("pgtraffic: every rule of the rules has lapsed (its until has passed): no rule applies", "rules", len(cfg.Rules))
	default:
		log.Warn("pgtraffic: rules whose until has passed select nothing", "lapsed", strings.Join(lapsed, ", "))
	}
}
