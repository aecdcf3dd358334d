package engine

import "sync"

// explaining holds the patterns whose EXPLAIN, the one that caches the pattern's plan, is on
// its way, so that a pattern new to a burst of statements (a deploy: the same handler in many
// goroutines at once) is explained once, not once per connection: the others wait for that
// EXPLAIN, holding no slot, and are priced by its plan (predict). The zero value is ready.
type explaining struct {
	mu sync.Mutex
	m  map[uint64]chan struct{} // closed when the pattern's EXPLAIN ends
}

// join returns, for pattern fp, the channel its EXPLAIN on its way closes when it ends, or, with
// none on its way and lead set, makes the caller's the one: lead then reports it, and the
// caller calls end when its EXPLAIN ends. A nil channel: none on its way, and the caller does
// not lead.
func (s *explaining) join(fp uint64, lead bool) (done <-chan struct{}, leads bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ch, ok := s.m[fp]; ok {
		return ch, false
	}
	if !lead {
		return nil, false
	}
	if s.m == nil {
		s.m = map[uint64]chan struct{}{}
	}
	s.m[fp] = make(chan struct{})
	return nil, true
}

// end ends the EXPLAIN of fp that the caller leads, waking the statements that wait for it.
func (s *explaining) end(fp uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.m[fp])
	delete(s.m, fp)
}
