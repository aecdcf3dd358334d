package coord

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestSharedAgainFallsBackOverInstancesSeen: a budget whose registration closed (a reload
// turned its sharing off) and that is registered again (turned back on) falls back, should
// Redis not answer its first syncs, over the instances it last saw sharing it, as it did
// before, not over FallbackInstances: a lone instance keeps the whole budget, not a tenth.
func TestSharedAgainFallsBackOverInstancesSeen(t *testing.T) {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never called: no Start
	defer rc.Close()
	c := newCoord(t, Options{Client: rc, FallbackInstances: 10})
	spec := Spec{Name: "b", MaxConcurrent: 30}
	h := c.Register(spec, newFakeLocal(1, 1))
	c.mu.Lock()
	h.e.core.known = 3 // as its syncs saw
	c.mu.Unlock()
	h.Close()
	again := c.Register(spec, newFakeLocal(1, 1))
	c.mu.Lock()
	slots := again.e.core.provisional().Slots
	c.mu.Unlock()
	if slots != 10 {
		t.Fatalf("shared again, its fallback lease has %d slots; want 30 over the 3 instances it saw, 10", slots)
	}
	again.Close()
	other := c.Register(Spec{Name: "new", MaxConcurrent: 30}, newFakeLocal(1, 1))
	c.mu.Lock()
	slots = other.e.core.provisional().Slots
	c.mu.Unlock()
	if slots != 3 {
		t.Fatalf("a budget never shared before has %d fallback slots; want 30 over FallbackInstances, 3", slots)
	}
	other.Close()
}
