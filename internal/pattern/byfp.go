package pattern

// ByFingerprint returns a cached pattern with the fingerprint fp, if any. It scans the cache
// (O(entries) under each shard's read lock): for introspection pages, not for the hot path.
func (c *Cache) ByFingerprint(fp uint64) (*Pattern, bool) {
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if e.p.FingerprintID == fp {
				s.mu.RUnlock()
				return e.p, true
			}
		}
		s.mu.RUnlock()
	}
	return nil, false
}
