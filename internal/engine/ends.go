package engine

import (
	"sync"
	"sync/atomic"
)

// ends tells the claims waiting under an in_flight threshold (throttle_when: {in_flight: N})
// that a statement ended: in_flight is the engine's own count, no sample, and it drops the
// moment a statement finishes, which no health sample would report. Its channel is closed at
// an end, and a new one made for the next, only while a claim watches: a statement's end costs
// one atomic load when nobody does.
type ends struct {
	watchers atomic.Int32
	mu       sync.Mutex    // protects ch
	ch       chan struct{} // closed at the next end; nil until watched
}

// watch registers a watcher until unwatch.
func (n *ends) watch() { n.watchers.Add(1) }

func (n *ends) unwatch() { n.watchers.Add(-1) }

// next returns the channel the next end closes. Take it before checking in_flight, so that an
// end after the check is not missed.
func (n *ends) next() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// ended tells the watchers, if any, that statements ended. (Small enough to be inlined into a
// statement's end, where nobody watching costs one atomic load.)
func (n *ends) ended() {
	if n.watchers.Load() > 0 {
		n.wake()
	}
}

// wake closes the channel the watchers wait on.
func (n *ends) wake() {
	n.mu.Lock()
	if n.ch != nil {
		close(n.ch)
		n.ch = nil
	}
	n.mu.Unlock()
}
