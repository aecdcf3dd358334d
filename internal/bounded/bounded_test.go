package bounded

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestText(t *testing.T) {
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"orders", 64, "orders"},
		{"", 4, ""},
		{"\xff\xfe", 64, "\uFFFD"},
		{"a\xffb", 64, "a\uFFFDb"},
		{"abcdef", 4, "abcd"},
		{"ééé", 5, "éé"}, // not cut inside the third é
		{"a\xff", 3, "a"},
		{strings.Repeat("x", 10_000), ValueLen, strings.Repeat("x", ValueLen)},
	}
	for _, tt := range tests {
		if got := Text(tt.s, tt.n); got != tt.want {
			t.Errorf("Text(%q, %d) = %q, want %q", tt.s, tt.n, got, tt.want)
		}
	}
}

func FuzzText(f *testing.F) {
	f.Add("\xff\xfe/orders", 8)
	f.Add("ééé", 5)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 {
			n = -n
		}
		if n < 0 {
			return // the most negative int
		}
		got := Text(s, n)
		if !utf8.ValidString(got) || len(got) > n {
			t.Fatalf("Text(%q, %d) = %q: invalid or too long", s, n, got)
		}
		if utf8.ValidString(s) && len(s) <= n && got != s {
			t.Fatalf("Text(%q, %d) = %q: changed a valid string within bounds", s, n, got)
		}
	})
}

func TestTextNoAllocation(t *testing.T) {
	s := strings.Repeat("a", 100)
	if n := testing.AllocsPerRun(100, func() { _ = Text(s, ValueLen) }); n != 0 {
		t.Errorf("Text of a valid, short string: %v allocations", n)
	}
}
