package pattern

import "testing"

func TestByFingerprint(t *testing.T) {
	c := NewCache(100)
	p, _ := c.Get("select * from orders where id = 1")
	c.Get("select * from items")
	got, ok := c.ByFingerprint(p.FingerprintID)
	if !ok || got != p {
		t.Fatalf("ByFingerprint(%x) = %v, %v; want the cached pattern", p.FingerprintID, got, ok)
	}
	if _, ok := c.ByFingerprint(p.FingerprintID ^ 1); ok {
		t.Fatal("found a pattern for a fingerprint never cached")
	}
}
