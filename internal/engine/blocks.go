package engine

import (
	"slices"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// BlockRecord is one group of recent refusals, for introspection: the statements of one
// pattern that one budget (or guard) refused for one reason, or, with Decision warn, that a
// warn-mode budget or guard would have refused.
type BlockRecord struct {
	Budget      string
	Decision    string // DecisionBlock or DecisionWarn
	Reason      string
	Fingerprint string
	Query       string // normalised text, cut to bounded.QueryLen; "" for a statement pg_query cannot parse
	Count       uint64
	First, Last time.Time
}

// recentGroups bounds the groups of refusals kept: a storm of one pattern is one group, and
// the least recently refused group makes room for a new one.
const recentGroups = 64

type blockKey struct{ budget, decision, reason, fingerprint string }

// blockLog is the status recorder of refusals. Refused statements write it, so it has a lock of
// its own, held for one map update (or, for a new group when full, a scan of the groups).
// The zero value is empty and ready.
type blockLog struct {
	mu     sync.Mutex // protects the fields below
	groups map[blockKey]*BlockRecord
}

func (l *blockLog) add(now time.Time, budget, decision, reason string, p *pattern.Pattern) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := blockKey{budget, decision, reason, p.Fingerprint}
	g := l.groups[k]
	if g == nil {
		if l.groups == nil {
			l.groups = make(map[blockKey]*BlockRecord, recentGroups)
		}
		if len(l.groups) >= recentGroups {
			var oldest *BlockRecord
			for _, g := range l.groups {
				if oldest == nil || g.Last.Before(oldest.Last) {
					oldest = g
				}
			}
			delete(l.groups, blockKey{oldest.Budget, oldest.Decision, oldest.Reason, oldest.Fingerprint})
		}
		g = &BlockRecord{Budget: budget, Decision: decision, Reason: reason, Fingerprint: p.Fingerprint,
			Query: p.Normalized, First: now, Last: now}
		l.groups[k] = g
	}
	g.Count++
	// A refusal is dated when its statement began or when it was refused (after a wait), so the
	// order recorded is nearly, not exactly, the order in time.
	if now.After(g.Last) {
		g.Last = now
	}
	if now.Before(g.First) {
		g.First = now
	}
}

func (l *blockLog) all() []BlockRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]BlockRecord, 0, len(l.groups))
	for _, g := range l.groups {
		out = append(out, *g)
	}
	return out
}

func (e *Engine) recordBlock(now time.Time, d *Denial, p *pattern.Pattern) {
	e.stats.Blocked.Add(1)
	e.blocks.add(now, d.Budget, DecisionBlock, d.Reason, p)
}

// RecentBlocks returns the groups of recent refusals, the most recently refused first.
func (e *Engine) RecentBlocks() []BlockRecord {
	out := e.blocks.all()
	slices.SortFunc(out, func(a, b BlockRecord) int {
		if c := b.Last.Compare(a.Last); c != 0 {
			return c
		}
		return b.First.Compare(a.First)
	})
	return out
}
