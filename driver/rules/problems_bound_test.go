package rules

import (
	"fmt"
	"strings"
	"testing"
)

// TestProblemsPastTheBoundAreCounted: a file of thousands of problems (the wrong file: a list
// of numbers where budgets go) is refused with its first problems by line and the count of the
// others, all of them counted though only the first maxKept are kept.
func TestProblemsPastTheBoundAreCounted(t *testing.T) {
	const n = 5 * maxKept
	src := `{"budgets":[` + strings.TrimSuffix(strings.Repeat("0,", n), ",") + `]}`
	_, err := Parse([]byte(src))
	if err == nil {
		t.Fatal("a list of numbers for budgets was accepted")
	}
	msg := err.Error()
	if want := fmt.Sprintf("%d more problems not shown", n-maxErrors); !strings.Contains(msg, want) {
		t.Errorf("error %q does not end with %q", msg[max(0, len(msg)-200):], want)
	}
	if !strings.Contains(msg, "budgets[0]") {
		t.Errorf("error %q does not show the first problem, budgets[0]", msg[:min(len(msg), 200)])
	}
}
