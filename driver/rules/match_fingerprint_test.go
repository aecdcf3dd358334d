package rules

import (
	"strings"
	"testing"
)

// TestFingerprintValue: a fingerprint match value is 16 hexadecimal digits, upper-case ones
// folded; one cut short, too long, or with a space would match no statement and is an error.
func TestFingerprintValue(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"50fde20626009aba", "50fde20626009aba"},
		{"50FDE20626009ABA", "50fde20626009aba"},
		{"0000000000000000", "0000000000000000"},
	} {
		got, err := FingerprintValue(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("FingerprintValue(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"50fde206", "50fde20626009aba ", " 50fde20626009aba", "50fde20626009abg", "50fde20626009aba0", ""} {
		if got, err := FingerprintValue(in); err == nil {
			t.Errorf("FingerprintValue(%q) = %q; want an error", in, got)
		}
	}
}

// TestFingerprintMatchRefusedWhenMalformed: the runbook's "block one query pattern" rule with a
// fingerprint cut short is refused, naming the field, rather than loaded to block nothing.
func TestFingerprintMatchRefusedWhenMalformed(t *testing.T) {
	_, err := Parse([]byte("budgets: [{name: b, max_concurrent: 0}]\nrules: [{budget: b, match: {fingerprint: 50fde206}}]\n"))
	if err == nil || !strings.Contains(err.Error(), "match.fingerprint") || !strings.Contains(err.Error(), "16 hexadecimal digits") {
		t.Errorf("a fingerprint match cut short: %v; want an error naming the field", err)
	}
}
