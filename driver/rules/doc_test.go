package rules

import (
	"os"
	"strings"
	"testing"
)

// The rules file shown in the package documentation parses, and sets what it says it sets.
func TestDocExampleParses(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "// # A rules file\n")
	if !ok {
		t.Fatal("doc.go has no section \"A rules file\"")
	}
	var file strings.Builder
	started := false
lines:
	for _, line := range strings.Split(section, "\n") {
		switch {
		case strings.HasPrefix(line, "//\t"):
			started = true
			file.WriteString(strings.TrimPrefix(line, "//\t") + "\n")
		case started && line == "//":
			file.WriteString("\n")
		case started:
			break lines // the end of the example
		}
	}
	cfg, err := Parse([]byte(file.String()))
	if err != nil {
		t.Fatalf("the documented rules file does not parse: %v\n%s", err, file.String())
	}
	if len(cfg.Budgets) != 3 || len(cfg.Rules) != 5 || cfg.Rules[4].Until.IsZero() || cfg.Guards.BlockTruncate.Match["app"] != "web" {
		t.Errorf("parsed %d budgets, %d rules, block_truncate %+v", len(cfg.Budgets), len(cfg.Rules), cfg.Guards.BlockTruncate)
	}
	if b := cfg.Budgets[0]; *b.MaxConcurrent != 4 || b.MaxQueue == nil || *b.MaxQueue != 2 || b.Explain != ExplainAuto || b.BurstLimit.String() != "10s" ||
		b.MaxDuration.String() != "30s" || b.Quarantine == nil || b.Quarantine.After != 3 {
		t.Errorf("reporting budget: %+v", b)
	}
}

// The runbook's rules parse.
func TestRunbookParses(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(src), "// # Incident runbook\n")
	if !ok {
		t.Fatal("doc.go has no section \"Incident runbook\"")
	}
	section, _, _ = strings.Cut(section, "// # ")
	var blocks []string
	var cur strings.Builder
	for _, line := range strings.Split(section, "\n") {
		if rest, ok := strings.CutPrefix(line, "//\t"); ok {
			cur.WriteString(rest + "\n")
		} else if cur.Len() > 0 {
			blocks = append(blocks, cur.String())
			cur.Reset()
		}
	}
	if len(blocks) != 2 {
		t.Fatalf("%d examples, want 2", len(blocks))
	}
	for _, b := range blocks {
		cfg, err := Parse([]byte(b))
		if err != nil {
			t.Fatalf("%v\n%s", err, b)
		}
		if len(cfg.Rules) != 1 || cfg.Rules[0].Until.IsZero() {
			t.Errorf("rules %+v", cfg.Rules)
		}
	}
}
