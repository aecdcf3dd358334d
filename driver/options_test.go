package driver

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/budget"
)

// TestMaxBucketsOption: WithMaxBuckets bounds each budget's per-key states; without it, or with
// n <= 0, the bound is the budget's default, defined once in internal/budget.
func TestMaxBucketsOption(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts []Option
		want int
	}{
		{"default", nil, budget.DefaultMaxKeys},
		{"set", []Option{WithMaxBuckets(7)}, 7},
		{"zero is the default", []Option{WithMaxBuckets(0)}, budget.DefaultMaxKeys},
		{"negative is the default", []Option{WithMaxBuckets(-1)}, budget.DefaultMaxKeys},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := ParseConfig([]byte("budgets:\n  - {name: a, per: tenant, max_concurrent: 1}\n"))
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewConnector("postgres://u@127.0.0.1:1/db", append([]Option{WithConfig(cfg)}, tt.opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if got := c.engine.Budgets()[0].Spec.MaxKeys; got != tt.want {
				t.Errorf("MaxKeys = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestEmptyRulesFileIsAnError: WithRulesFile("") (an unset environment variable, say) is an
// error naming the option, not a connector that silently runs without rules; WithConfig after
// it wins as any later option does.
func TestEmptyRulesFileIsAnError(t *testing.T) {
	_, err := NewConnector("postgres://u@127.0.0.1:1/db", WithRulesFile(""))
	if err == nil || !strings.Contains(err.Error(), "WithRulesFile") {
		t.Fatalf("WithRulesFile(\"\"): %v; want an error naming the option", err)
	}
	cfg, err := ParseConfig([]byte("budgets: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector("postgres://u@127.0.0.1:1/db", WithRulesFile(""), WithConfig(cfg))
	if err != nil {
		t.Fatalf("WithConfig after WithRulesFile(\"\"): %v; want the later option to win", err)
	}
	c.Close()
}

// TestNilConfigIsAnError: WithConfig(nil), what an unchecked ParseConfig error leaves, is an
// error naming the option on both front ends, not a connector or pool that silently runs
// without rules; WithRulesFile after it wins as any later option does.
func TestNilConfigIsAnError(t *testing.T) {
	cfg, perr := ParseConfig([]byte("budgets:\n  - {name: gate, mode: enforce, max_concurent: 0}\n"))
	if perr == nil || cfg != nil {
		t.Fatalf("ParseConfig of a typo: %v, %v", cfg, perr)
	}
	const dsn = "postgres://u@127.0.0.1:1/db"
	if _, err := NewConnector(dsn, WithConfig(cfg)); err == nil || !strings.Contains(err.Error(), "WithConfig") {
		t.Fatalf("NewConnector(WithConfig(nil)): %v; want an error naming the option", err)
	}
	if _, err := NewPool(context.Background(), dsn, WithConfig(cfg)); err == nil || !strings.Contains(err.Error(), "WithConfig") {
		t.Fatalf("NewPool(WithConfig(nil)): %v; want an error naming the option", err)
	}
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("budgets: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := NewConnector(dsn, WithConfig(cfg), WithRulesFile(path))
	if err != nil {
		t.Fatalf("WithRulesFile after WithConfig(nil): %v; want the later option to win", err)
	}
	c.Close()
}
