package engine

import (
	"slices"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// BlockRecord is one recent block, for introspection.
type BlockRecord struct {
	At          time.Time `json:"at"`
	Budget      string    `json:"budget"`
	Reason      string    `json:"reason"`
	Fingerprint string    `json:"fingerprint"`
	Query       string    `json:"query"` // normalised text
}

const recentBlocks = 32

// blockLog is the status recorder: a ring of the most recent blocks. Refused statements write
// it, so it has a lock of its own, which nothing holds for longer than a copy of the ring.
// The zero value is empty and ready.
type blockLog struct {
	mu   sync.Mutex // protects the fields below
	ring [recentBlocks]BlockRecord
	n    int // blocks recorded; the last one is ring[(n-1)%recentBlocks]
}

func (l *blockLog) add(r BlockRecord) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ring[l.n%recentBlocks] = r
	l.n++
}

// last returns the blocks the ring holds, the last recorded first.
func (l *blockLog) last() []BlockRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]BlockRecord, 0, min(l.n, recentBlocks))
	for i := l.n - 1; i >= 0 && i >= l.n-recentBlocks; i-- {
		out = append(out, l.ring[i%recentBlocks])
	}
	return out
}

func (e *Engine) recordBlock(now time.Time, d *Denial, p *pattern.Pattern) {
	e.stats.Blocked.Add(1)
	e.blocks.add(BlockRecord{At: now, Budget: d.Budget, Reason: d.Reason, Fingerprint: d.Fingerprint, Query: p.Normalized})
}

// RecentBlocks returns the most recent blocks, newest first.
func (e *Engine) RecentBlocks() []BlockRecord {
	out := e.blocks.last()
	// A block is dated when its statement began or when it was refused (after a wait), so the
	// order recorded is nearly, not exactly, the order in time.
	slices.SortStableFunc(out, func(a, b BlockRecord) int { return b.At.Compare(a.At) })
	return out
}
