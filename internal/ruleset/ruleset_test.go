package ruleset

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

func m(kv ...string) map[string]string {
	out := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[kv[i]] = kv[i+1]
	}
	return out
}

func tags(kv ...string) []KV {
	var out []KV
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, KV{kv[i], kv[i+1]})
	}
	return out
}

func mustCompile(t testing.TB, matches ...map[string]string) *Set {
	t.Helper()
	rs := make([]rules.Rule, len(matches))
	for i, mt := range matches {
		rs[i] = rules.Rule{Budget: "b", Match: mt}
	}
	s, err := Compile(rs, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMatch(t *testing.T) {
	s := mustCompile(t,
		m("app", "reporting"),                                   // 0
		m("app", "commerce", "controller", "export"),            // 1 conjunction
		m("remote_address", "203.0.113.0/24"),                   // 2
		m("remote_address", "203.0.0.0/16"),                     // 3 contains 2
		m("remote_address", "0.0.0.0/0"),                        // 4 every IPv4 address
		m("remote_address", "2001:db8::/32"),                    // 5
		m("remote_address", "2001:db8:1::/48"),                  // 6 inside 5
		m("app", "reporting"),                                   // 7 same pair as 0
		m("table", "orders"),                                    // 8
		m("table", "customers", "statement", "delete"),          // 9
		m("app", "commerce", "remote_address", "10.0.0.0/8"),    // 10 conjunction with a CIDR pair
		m("remote_address", "192.0.2.1/32"),                     // 11 host route
		m("tenant", "::ffff:198.51.100.0/120"),                  // 12 written IPv4-mapped
		m("route", "/api/export"),                               // 13 a '/' that is no CIDR
		m("fingerprint", "00000000a1b2c3d4", "username", "etl"), // 14 built-in keys are ordinary keys
		m("x", "10.1.0.0/16", "y", "10.2.0.0/16"),               // 15 conjunction of CIDR pairs
	)
	tests := []struct {
		name string
		tags []KV
		want []int
	}{
		{"no tags", nil, nil},
		{"no rule", tags("app", "other"), nil},
		{"exact, two rules on one pair", tags("app", "reporting"), []int{0, 7}},
		{"conjunction holds", tags("app", "commerce", "controller", "export"), []int{1}},
		{"conjunction in any order", tags("controller", "export", "user", "x", "app", "commerce"), []int{1}},
		{"half a conjunction", tags("app", "commerce"), nil},
		{"other half", tags("controller", "export"), nil},
		{"conjunction value differs", tags("app", "commerce", "controller", "import"), nil},
		{"CIDR longest and all", tags("remote_address", "203.0.113.9"), []int{2, 3, 4}},
		{"CIDR shorter only", tags("remote_address", "203.0.7.1"), []int{3, 4}},
		{"CIDR /0 only", tags("remote_address", "8.8.8.8"), []int{4}},
		{"CIDR host route", tags("remote_address", "192.0.2.1"), []int{4, 11}},
		{"CIDR host route, neighbour", tags("remote_address", "192.0.2.2"), []int{4}},
		{"CIDR with a port", tags("remote_address", "203.0.113.9:54321"), []int{2, 3, 4}},
		{"IPv6", tags("remote_address", "2001:db8:1::5"), []int{5, 6}},
		{"IPv6 outer only", tags("remote_address", "2001:db8:2::5"), []int{5}},
		{"IPv6 with port", tags("remote_address", "[2001:db8:1::5]:5432"), []int{5, 6}},
		{"IPv6 with zone", tags("remote_address", "2001:db8:1::5%eth0"), []int{5, 6}},
		{"IPv6 outside", tags("remote_address", "2001:db9::1"), nil},
		{"IPv4-mapped tag matches IPv4 rules", tags("remote_address", "::ffff:203.0.113.9"), []int{2, 3, 4}},
		{"IPv4 tag matches IPv4-mapped rule", tags("tenant", "198.51.100.7"), []int{12}},
		{"IPv4-mapped tag matches IPv4-mapped rule", tags("tenant", "::ffff:198.51.100.7"), []int{12}},
		{"not an address", tags("remote_address", "localhost"), nil},
		{"address-like junk", tags("remote_address", "1.2.3"), nil},
		{"address under a key without CIDR rules", tags("app", "203.0.113.9"), nil},
		{"CIDR value as exact text does not match", tags("remote_address", "203.0.113.0/24"), nil},
		{"conjunction with CIDR pair", tags("app", "commerce", "remote_address", "10.9.8.7"), []int{4, 10}},
		{"conjunction with CIDR pair outside", tags("app", "commerce", "remote_address", "11.9.8.7"), []int{4}},
		{"conjunction of CIDR pairs", tags("x", "10.1.2.3", "y", "10.2.3.4"), []int{15}},
		{"conjunction of CIDR pairs, one out", tags("x", "10.1.2.3", "y", "10.3.3.4"), nil},
		{"multi-valued key", tags("table", "customers", "table", "orders", "statement", "delete"), []int{8, 9}},
		{"multi-valued key, conjunction misses", tags("table", "orders", "table", "items", "statement", "delete"), []int{8}},
		{"duplicate tags count once", tags("app", "reporting", "app", "reporting", "table", "orders", "table", "orders"), []int{0, 7, 8}},
		{"two addresses in one prefix count once", tags("remote_address", "203.0.113.1", "remote_address", "203.0.113.2"), []int{2, 3, 4}},
		{"route with slashes", tags("route", "/api/export"), []int{13}},
		{"built-in keys", tags("username", "etl", "fingerprint", "00000000a1b2c3d4", "statement", "select"), []int{14}},
		{"keys are case-sensitive", tags("App", "reporting"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := s.Match(tt.tags, nil)
			if !slices.Equal(got, tt.want) {
				t.Errorf("Match(%v) = %v, want %v", tt.tags, got, tt.want)
			}
			// Appending after existing entries leaves them alone and still dedups only the new part.
			prefix := []int{99, 0}
			got = s.Match(tt.tags, prefix)
			if !slices.Equal(got[:2], []int{99, 0}) || !slices.Equal(got[2:], tt.want) {
				t.Errorf("Match with a prefilled dst = %v, want [99 0] + %v", got, tt.want)
			}
		})
	}
}

func TestCompile(t *testing.T) {
	budgets := map[string]int{"a": 0, "b": 1}
	index := func(name string) int {
		if i, ok := budgets[name]; ok {
			return i
		}
		return -1
	}
	tests := []struct {
		name    string
		rules   []rules.Rule
		index   func(string) int
		wantErr string
	}{
		{"ok", []rules.Rule{{Budget: "b", Match: m("app", "x")}, {Budget: "a", Match: m("app", "y")}}, index, ""},
		{"nil index ignores budgets", []rules.Rule{{Budget: "zzz", Match: m("app", "x")}}, nil, ""},
		{"unknown budget", []rules.Rule{{Budget: "c", Match: m("app", "x")}}, index, `pgtraffic: rules[0]: unknown budget "c"`},
		{"empty match", []rules.Rule{{Budget: "a"}}, index, "pgtraffic: rules[0]: empty match"},
		{"bad CIDR", []rules.Rule{{Budget: "a", Match: m("ip", "10.0.0.0/40")}}, index, `pgtraffic: rules[0].match.ip: invalid CIDR prefix "10.0.0.0/40"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := Compile(tt.rules, tt.index)
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if s.Len() != len(tt.rules) || s.Empty() {
				t.Fatalf("Len = %d, Empty = %v", s.Len(), s.Empty())
			}
			for i, r := range tt.rules {
				want := -1
				if tt.index != nil {
					want = budgets[r.Budget]
				}
				if got := s.Budget(i); got != want {
					t.Errorf("Budget(%d) = %d, want %d", i, got, want)
				}
			}
		})
	}
}

func TestEmpty(t *testing.T) {
	var nilSet *Set
	empty, err := Compile(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*Set{"nil": nilSet, "zero": {}, "compiled": empty} {
		t.Run(name, func(t *testing.T) {
			if !s.Empty() || s.Len() != 0 {
				t.Errorf("Empty = %v, Len = %d", s.Empty(), s.Len())
			}
			if got := s.Match(tags("app", "x"), nil); got != nil {
				t.Errorf("Match = %v", got)
			}
		})
	}
}

// TestCandidateSpread checks that conjunctions sharing a pair are filed under their other
// pairs, so that the shared pair does not collect them all.
func TestCandidateSpread(t *testing.T) {
	var rules []map[string]string
	for i := range 100 {
		rules = append(rules, m("app", "commerce", "controller", fmt.Sprint("c", i)))
	}
	s := mustCompile(t, rules...)
	if n := len(s.exact[KV{"app", "commerce"}]); n > 1 {
		t.Errorf("%d rules filed under app=commerce, want at most 1", n)
	}
	if got := s.Match(tags("app", "commerce", "controller", "c42"), nil); !slices.Equal(got, []int{42}) {
		t.Errorf("Match = %v, want [42]", got)
	}
}

func TestMatchDoesNotAllocate(t *testing.T) {
	s := mustCompile(t,
		m("app", "reporting"),
		m("app", "commerce", "controller", "export"),
		m("remote_address", "203.0.113.0/24"),
		m("remote_address", "2001:db8::/32"),
		m("app", "commerce", "remote_address", "10.0.0.0/8"),
	)
	cases := map[string][]KV{
		"exact":            tags("app", "reporting", "table", "orders", "statement", "select"),
		"conjunction":      tags("app", "commerce", "controller", "export"),
		"IPv4":             tags("remote_address", "203.0.113.5"),
		"IPv4 with port":   tags("remote_address", "203.0.113.5:4242"),
		"IPv6":             tags("remote_address", "[2001:db8::1]:4242"),
		"IPv4-mapped":      tags("remote_address", "::ffff:203.0.113.5"),
		"CIDR conjunction": tags("app", "commerce", "remote_address", "10.1.1.1"),
		"not an address":   tags("remote_address", "unknown"),
	}
	dst := make([]int, 0, 16)
	for name, tg := range cases {
		t.Run(name, func(t *testing.T) {
			if n := testing.AllocsPerRun(100, func() { dst = s.Match(tg, dst[:0]) }); n != 0 {
				t.Errorf("Match allocated %v times per run", n)
			}
		})
	}
}

// benchSet builds n single-pair rules on app=... plus, every 10th, a conjunction and a CIDR
// rule, so that the index holds every kind at every size.
func benchSet(b *testing.B, n int) *Set {
	var rules []map[string]string
	for i := range n {
		switch i % 10 {
		case 0:
			rules = append(rules, m("app", fmt.Sprint("app", i), "controller", fmt.Sprint("c", i)))
		case 1:
			rules = append(rules, m("remote_address", fmt.Sprintf("10.%d.%d.0/24", i/256%256, i%256)))
		default:
			rules = append(rules, m("app", fmt.Sprint("app", i)))
		}
	}
	return mustCompile(b, rules...)
}

func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		s := benchSet(b, n)
		tg := tags("app", "app2", "controller", "c0", "remote_address", "10.0.1.7",
			"table", "orders", "statement", "select", "username", "web")
		b.Run(fmt.Sprint("rules=", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				dst := make([]int, 0, 8)
				ran := false
				for pb.Next() {
					dst = s.Match(tg, dst[:0])
					ran = true
				}
				if ran && len(dst) != 2 {
					b.Errorf("matched %v, want 2 rules", dst)
				}
			})
		})
	}
}

func BenchmarkCompile(b *testing.B) {
	var rs []rules.Rule
	for i := range 10_000 {
		rs = append(rs, rules.Rule{Budget: "b", Match: m("app", fmt.Sprint("app", i))})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(rs, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// FuzzMatchCIDR compiles one rule on a fuzzed value and checks Match on a fuzzed tag value
// against the definition: a prefix contains the address, anything else is equal text.
func FuzzMatchCIDR(f *testing.F) {
	for _, s := range [][2]string{
		{"203.0.113.0/24", "203.0.113.7"},
		{"2001:db8::/32", "[2001:db8::1]:80"},
		{"::ffff:1.2.3.0/120", "1.2.3.4"},
		{"0.0.0.0/0", "::ffff:8.8.8.8"},
		{"::/0", "::1%lo"},
		{"10.0.0.0/33", "10.0.0.1"},
		{"/api/x", "/api/x"},
		{"fe80::1%eth0/64", "fe80::1%eth0/64"},
		{"1.2.3.4/32", "1.2.3.4:99999"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, ruleValue, tagValue string) {
		s, err := Compile([]rules.Rule{{Match: m("k", ruleValue)}}, nil)
		p, isPrefix, perr := rules.ParseMatchValue(ruleValue)
		if (err != nil) != (perr != nil) {
			t.Fatalf("Compile err %v, ParseMatchValue err %v", err, perr)
		}
		if err != nil {
			return
		}
		got := len(s.Match([]KV{{"k", tagValue}}, nil)) == 1
		var want bool
		if isPrefix {
			a, ok := parseAddr(tagValue)
			want = ok && p.Contains(a)
			if ok && !strings.Contains(tagValue, "%") {
				// The reference parse must agree with netip for plain addresses.
				if ref, err := netip.ParseAddr(tagValue); err == nil && ref.Unmap() != a {
					t.Fatalf("parseAddr(%q) = %v, netip says %v", tagValue, a, ref)
				}
			}
		} else {
			want = tagValue == ruleValue
		}
		if got != want {
			t.Fatalf("rule %q, tag %q: matched %v, want %v", ruleValue, tagValue, got, want)
		}
	})
}

// TestConcurrentMatch runs Match from several goroutines on one Set (run with -race).
func TestConcurrentMatch(t *testing.T) {
	s := mustCompile(t, m("app", "a"), m("ip", "10.0.0.0/8"), m("app", "a", "ip", "10.1.0.0/16"))
	tg := tags("app", "a", "ip", "10.1.2.3")
	errs := make(chan string, 4)
	for range 4 {
		go func() {
			var dst []int
			for range 1000 {
				dst = s.Match(tg, dst[:0])
				if !slices.Equal(dst, []int{0, 1, 2}) {
					errs <- fmt.Sprint(dst)
					return
				}
			}
			errs <- ""
		}()
	}
	for range 4 {
		if e := <-errs; e != "" {
			t.Errorf("Match = %s, want [0 1 2]", e)
		}
	}
}

// BenchmarkCompileLarge indexes 100k two-pair rules sharing one pair (a rule per tenant of one
// application), with a budget lookup per rule, as a reload of a large rules file does.
func BenchmarkCompileLarge(b *testing.B) {
	const n = 100_000
	rs := make([]rules.Rule, n)
	index := make(map[string]int, n)
	for i := range rs {
		name := fmt.Sprint("tenant-", i)
		index[name] = i
		rs[i] = rules.Rule{Budget: name, Match: map[string]string{"app": "shop", "tenant": fmt.Sprint("t", i)}}
	}
	budgetIndex := func(name string) int {
		if i, ok := index[name]; ok {
			return i
		}
		return -1
	}
	b.ReportAllocs()
	for b.Loop() {
		s, err := Compile(rs, budgetIndex)
		if err != nil {
			b.Fatal(err)
		}
		if s.Len() != n {
			b.Fatalf("%d rules", s.Len())
		}
	}
}
