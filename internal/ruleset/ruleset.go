package ruleset

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// KV is one tag: a key and a value. A query may carry several tags with one key (one
// table=... per table it references).
type KV struct{ Key, Value string }

// Set is an immutable index of rules. Its zero value, like a nil *Set, matches nothing.
// It is safe for concurrent use.
type Set struct {
	rules []rule

	// exact maps a pair to the rules whose candidate pair it is.
	exact map[KV][]int32
	// cidr maps a key and a masked prefix to the rules whose candidate pair it is.
	cidr map[cidrKey][]int32
	// lens lists, per key, the prefix lengths the CIDR candidate pairs of that key use.
	lens map[string]*maskLens
	// keys is a 256-bit filter of the keys that any candidate pair uses: a tag whose key's bit is
	// clear cannot select a rule, and is skipped without hashing its key and value. Most of a
	// statement's tags (username, fingerprint, ...) usually fall here.
	keys [4]uint64
}

// keyBit is the filter bit of key: cheap, and different for the usual tag keys.
func keyBit(key string) uint8 {
	if key == "" {
		return 0
	}
	return uint8(len(key)*37) ^ key[0] ^ key[len(key)-1]<<3
}

func (s *Set) mayUse(key string) bool {
	b := keyBit(key)
	return s.keys[b>>6]&(1<<(b&63)) != 0
}

func (s *Set) noteKey(key string) {
	b := keyBit(key)
	s.keys[b>>6] |= 1 << (b & 63)
}

type rule struct {
	budget int
	exact  []KV      // the rule's exact pairs
	cidrs  []cidrKey // the rule's CIDR pairs
	single bool      // one pair only: being a candidate is matching
}

type cidrKey struct {
	key    string
	prefix netip.Prefix
}

// maskLens holds distinct prefix lengths, longest first.
type maskLens struct{ v4, v6 []uint8 }

// Compile builds the index of rules. budgetIndex maps a rule's budget name to an index that
// [Set.Budget] reports back, or -1 for an unknown name, which is an error; a nil budgetIndex
// skips budget names (e.g. to index a guard's scope). Match values are classified as
// [rules.Rule] describes: CIDR prefixes or exact values. A rule with an empty match is an
// error (it would match every query; scope-less guards need no index).
func Compile(rs []rules.Rule, budgetIndex func(name string) int) (*Set, error) {
	s := &Set{
		rules: make([]rule, len(rs)),
		exact: make(map[KV][]int32),
		cidr:  make(map[cidrKey][]int32),
		lens:  make(map[string]*maskLens),
	}
	if len(rs) > 1<<31-1 {
		return nil, fmt.Errorf("pgtraffic: too many rules (%d)", len(rs))
	}
	for i := range rs {
		r := &rs[i]
		cr := rule{budget: -1}
		if budgetIndex != nil {
			if cr.budget = budgetIndex(r.Budget); cr.budget < 0 {
				return nil, fmt.Errorf("pgtraffic: rules[%d]: unknown budget %q", i, r.Budget)
			}
		}
		if len(r.Match) == 0 {
			return nil, fmt.Errorf("pgtraffic: rules[%d]: empty match", i)
		}
		for _, k := range slices.Sorted(maps.Keys(r.Match)) {
			v := r.Match[k]
			p, isPrefix, err := rules.ParseMatchValue(v)
			switch {
			case err != nil:
				return nil, fmt.Errorf("pgtraffic: rules[%d].match.%s: %w", i, k, err)
			case isPrefix:
				cr.cidrs = append(cr.cidrs, cidrKey{k, p})
			default:
				if v, err = rules.ExactMatchValue(k, v); err != nil {
					return nil, fmt.Errorf("pgtraffic: rules[%d].match.%s: %w", i, k, err)
				}
				cr.exact = append(cr.exact, KV{k, v})
			}
		}
		cr.single = len(cr.exact)+len(cr.cidrs) == 1
		s.rules[i] = cr
		s.file(int32(i), &cr)
	}
	for _, l := range s.lens {
		// Longest first, so that the first match found is the most specific one.
		slices.Sort(l.v4)
		slices.Reverse(l.v4)
		slices.Sort(l.v6)
		slices.Reverse(l.v6)
	}
	return s, nil
}

// file indexes rule i under one candidate pair: an exact pair if it has one (a map probe
// per tag, where a CIDR pair costs one per mask length), and among those the pair with the
// fewest rules so far, so that many conjunctions sharing a pair (app=commerce, ...) spread
// over their other pairs.
func (s *Set) file(i int32, r *rule) {
	if len(r.exact) > 0 {
		best := fewest(r.exact, s.exact)
		s.exact[best] = append(s.exact[best], i)
		s.noteKey(best.Key)
		return
	}
	best := fewest(r.cidrs, s.cidr)
	s.cidr[best] = append(s.cidr[best], i)
	s.noteKey(best.key)
	l := s.lens[best.key]
	if l == nil {
		l = &maskLens{}
		s.lens[best.key] = l
	}
	bits := uint8(best.prefix.Bits())
	if best.prefix.Addr().Is4() {
		if !slices.Contains(l.v4, bits) {
			l.v4 = append(l.v4, bits)
		}
	} else if !slices.Contains(l.v6, bits) {
		l.v6 = append(l.v6, bits)
	}
}

// fewest returns the first of keys (at least one) under which index holds the fewest rules.
func fewest[K comparable](keys []K, index map[K][]int32) K {
	best := keys[0]
	for _, k := range keys[1:] {
		if len(index[k]) < len(index[best]) {
			best = k
		}
	}
	return best
}

// Empty reports whether the set holds no rules, so that a caller can skip tag work.
func (s *Set) Empty() bool { return s == nil || len(s.rules) == 0 }

// Len returns the number of rules.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.rules)
}

// Budget returns the budget index of rule i (0 <= i < Len()), as budgetIndex gave it to
// [Compile] (-1 when it was nil).
func (s *Set) Budget(i int) int { return s.rules[i].budget }

// Match appends to dst the index (into the rules given to [Compile]) of every rule whose
// whole match holds for tags, each once, in ascending order, and returns dst. Indexes
// already in dst before the call are left alone. A CIDR pair holds for a tag of its key whose
// value is an IP address ("203.0.113.5", "[2001:db8::1]:5432", "::ffff:203.0.113.5") inside
// the prefix. Match does not allocate when dst has room for the result, except for a value
// under a key with CIDR rules that is shaped like an address but is not one ("1.2.3",
// "cafe"): netip's parse error allocates.
func (s *Set) Match(tags []KV, dst []int) []int {
	if s.Empty() {
		return dst
	}
	start := len(dst)
	for i := range tags {
		t := &tags[i]
		if !s.mayUse(t.Key) {
			continue
		}
		if ids, ok := s.exact[*t]; ok {
			dst = s.consider(ids, tags, dst, start)
		}
		if len(s.lens) == 0 {
			continue
		}
		l := s.lens[t.Key]
		if l == nil {
			continue
		}
		addr, ok := parseAddr(t.Value)
		if !ok {
			continue
		}
		lens := l.v6
		if addr.Is4() {
			lens = l.v4
		}
		for _, bits := range lens {
			p, err := addr.Prefix(int(bits))
			if err != nil {
				continue
			}
			if ids, ok := s.cidr[cidrKey{t.Key, p}]; ok {
				dst = s.consider(ids, tags, dst, start)
			}
		}
	}
	// Insertion sort: results are few, and sort.Ints would allocate for the interface.
	out := dst[start:]
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return dst
}

// consider appends the candidates ids that hold for tags and are not in dst[start:] yet.
func (s *Set) consider(ids []int32, tags []KV, dst []int, start int) []int {
	for _, id := range ids {
		if slices.Contains(dst[start:], int(id)) {
			continue
		}
		r := &s.rules[id]
		if r.single || r.holds(tags) {
			dst = append(dst, int(id))
		}
	}
	return dst
}

// holds reports whether every pair of r is among tags.
func (r *rule) holds(tags []KV) bool {
	for _, kv := range r.exact {
		if !slices.Contains(tags, kv) {
			return false
		}
	}
	for _, c := range r.cidrs {
		if !containsAddr(tags, c) {
			return false
		}
	}
	return true
}

func containsAddr(tags []KV, c cidrKey) bool {
	for i := range tags {
		if tags[i].Key != c.key {
			continue
		}
		if a, ok := parseAddr(tags[i].Value); ok && c.prefix.Contains(a) {
			return true
		}
	}
	return false
}

// parseAddr reads a tag value as an IP address: "ip", "ip:port" or "[ipv6]:port", as
// remote addresses come. IPv4-mapped IPv6 addresses are unmapped (prefixes were normalised
// the same way by rules.ParseMatchValue) and zones dropped. Values that cannot be an
// address are refused before netip is asked, because its errors allocate.
func parseAddr(v string) (netip.Addr, bool) {
	if !addrShaped(v) {
		return netip.Addr{}, false
	}
	var a netip.Addr
	colons := 0
	for i := 0; i < len(v); i++ {
		if v[i] == ':' {
			colons++
		}
	}
	if v[0] == '[' || colons == 1 { // IPv6 has at least two colons; one means IPv4:port
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			return netip.Addr{}, false
		}
		a = ap.Addr()
	} else {
		var err error
		if a, err = netip.ParseAddr(v); err != nil {
			return netip.Addr{}, false
		}
	}
	return a.Unmap().WithZone(""), true
}

// addrShaped reports whether v uses only the characters of an address, optionally with a
// port and a zone (anything after '%' up to ']').
func addrShaped(v string) bool {
	if len(v) < 2 || len(v) > 64 {
		return false
	}
	zone := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case zone:
			if c == ']' {
				zone = false
			}
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f', c >= 'A' && c <= 'F', c == '.', c == ':', c == '[', c == ']':
		case c == '%':
			zone = true
		default:
			return false
		}
	}
	return true
}
