package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSetConfigNilKeepsRules: a reload written as "cfg, err := driver.ParseConfig(b);
// c.SetConfig(cfg)" that forgets err passes nil for a broken file. SetConfig(nil) is an error
// and the rules in force stay: the block on app=x still refuses, and so does require_where.
// Before, it returned nil and removed every budget and guard.
func TestSetConfigNilKeepsRules(t *testing.T) {
	c, db := openRules(t, `
budgets: [{name: b, mode: enforce, max_concurrent: 0}]
rules: [{budget: b, match: {app: x}}]
guards: {require_where: enforce}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	cfg, err := driver.ParseConfig([]byte("budgets: [{name: b, max_concurent: 1}]\n"))
	if cfg != nil || err == nil {
		t.Fatalf("ParseConfig of a typo: %v, %v; want nil and an error", cfg, err)
	}
	if err := c.SetConfig(cfg); err == nil {
		t.Error("SetConfig(nil) returned no error")
	}
	if _, err := db.ExecContext(ctx, "select 1"); !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("after SetConfig(nil) the block on app=x: %v, want refused", err)
	}
	if _, err := db.ExecContext(context.Background(), "delete from pg_temp.nothing_here"); !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("after SetConfig(nil) a DELETE without WHERE: %v, want refused by require_where", err)
	}
	if n := len(c.Snapshot().Budgets); n != 1 {
		t.Errorf("%d budgets after SetConfig(nil), want the 1 in force", n)
	}
}
