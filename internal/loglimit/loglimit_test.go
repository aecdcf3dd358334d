package loglimit

import (
	"testing"
	"time"
)

// TestLimiter: one line a key per Every, the next one saying how many were suppressed; keys
// apart.
func TestLimiter(t *testing.T) {
	var l Limiter
	t0 := time.Unix(1000, 0)
	if ok, n := l.Allow("a", t0); !ok || n != 0 {
		t.Fatalf("first line: %v %d", ok, n)
	}
	for i := range 5 {
		if ok, _ := l.Allow("a", t0.Add(time.Duration(i)*time.Millisecond)); ok {
			t.Fatalf("line %d within Every allowed", i)
		}
	}
	if ok, _ := l.Allow("b", t0); !ok {
		t.Fatal("another key's first line suppressed")
	}
	if ok, n := l.Allow("a", t0.Add(Every)); !ok || n != 5 {
		t.Fatalf("the line after Every: %v, %d suppressed; want true, 5", ok, n)
	}
}
