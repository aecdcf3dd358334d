package bounded

import (
	"strconv"
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

func TestCut(t *testing.T) {
	long := strings.Repeat("x", 10_000)
	tests := []struct {
		s    string
		n    int
		want string
	}{
		{"orders", 64, "orders"},
		{"", 4, ""},
		{"a\xffb", 64, "a\uFFFDb"},
		{long, 10_000, long},
		{long, 10_001, long},
		// Room is kept for the digits of the whole length, here 5 for 9,921.
		{long, 100, long[:100-len("… (10000 bytes cut)")] + "… (9921 bytes cut)"},
		{long[:30], 29, long[:29-len("… (30 bytes cut)")] + "… (19 bytes cut)"},
		// Not cut inside an é (2 bytes): 9 bytes of room hold 4 of them.
		{strings.Repeat("é", 100), 9 + len("… (200 bytes cut)"), "éééé… (192 bytes cut)"},
		// Too small for the marker: cut as Text cuts.
		{"abcdef", 4, "abcd"},
		{"ééé", 5, "éé"},
	}
	for _, tt := range tests {
		if got := Cut(tt.s, tt.n); got != tt.want {
			t.Errorf("Cut(%.20q (%d bytes), %d) = %q, want %q", tt.s, len(tt.s), tt.n, got, tt.want)
		}
	}
}

func FuzzCut(f *testing.F) {
	f.Add("\xff\xfe/orders", 8)
	f.Add(strings.Repeat("é", 100), 30)
	f.Add(strings.Repeat("x", 1000), 22)
	f.Fuzz(func(t *testing.T, s string, n int) {
		if n < 0 {
			n = -n
		}
		if n < 0 {
			return // the most negative int
		}
		got := Cut(s, n)
		if !utf8.ValidString(got) || len(got) > n {
			t.Fatalf("Cut(%q, %d) = %q: invalid or too long", s, n, got)
		}
		v := Valid(s)
		if len(v) <= n {
			if got != v {
				t.Fatalf("Cut(%q, %d) = %q, want %q: cut a text within bounds", s, n, got, v)
			}
			return
		}
		kept, marker, ok := strings.Cut(got, cutOpen)
		if !ok {
			if got != Text(s, n) {
				t.Fatalf("Cut(%q, %d) = %q: no marker, and not as Text cuts", s, n, got)
			}
			return
		}
		for strings.Contains(marker, cutOpen) { // s itself held the marker's opening
			k, m, _ := strings.Cut(marker, cutOpen)
			kept, marker = kept+cutOpen+k, m
		}
		if !strings.HasPrefix(v, kept) || marker != strconv.Itoa(len(v)-len(kept))+cutClose {
			t.Fatalf("Cut(%q, %d) = %q: not a prefix and the bytes cut", s, n, got)
		}
		if len(kept) < n-len(cutOpen)-decimalLen(len(v))-len(cutClose)-(utf8.UTFMax-1) {
			t.Fatalf("Cut(%q, %d) = %q: cut more than the marker needs", s, n, got)
		}
	})
}

func TestCutNoAllocation(t *testing.T) {
	s := strings.Repeat("a", 100)
	if n := testing.AllocsPerRun(100, func() { _ = Cut(s, QueryLen) }); n != 0 {
		t.Errorf("Cut of a valid, short string: %v allocations", n)
	}
}
