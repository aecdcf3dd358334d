package runtime

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func TestCoordinationWithoutRedisIsAnError(t *testing.T) {
	r, _ := newRuntime(t, "")
	cfg, err := rules.Parse([]byte("coordination: {sync_interval: 1s}\nbudgets:\n  - {name: a, max_concurrent: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetConfig(cfg); err == nil || !strings.Contains(err.Error(), "no redis URL") {
		t.Fatalf("SetConfig = %v, want an error naming the missing redis URL", err)
	}
}

// TestReloadSharesAndUnsharesBudgets: a coordination section shares the budgets that have a
// limit to share; a reload without it makes them local again, enforcing their spec.
func TestReloadSharesAndUnsharesBudgets(t *testing.T) {
	url := deadRedis(t)
	local := `
budgets:
  - {name: a, mode: enforce, max_concurrent: 1}
  - {name: q, mode: enforce, per_query_limit: 1s}
rules:
  - {budget: a, match: {app: x}}
`
	r, clk := newRuntime(t, "coordination: {redis: \""+url+"\"}\n"+local)
	st := r.Coordination()
	if len(st) != 1 || st[0].Name != "a" {
		t.Fatalf("shared budgets %+v, want only a (q has nothing to share)", st)
	}
	if r.Instance() == "" {
		t.Error("no instance id while coordinating")
	}
	// a, which has no per tag, asks for its lease at once; Redis is unreachable, so after that
	// first sync fails it runs on its fallback share: one slot (1 over the 10 instances assumed,
	// at least one).
	deadline := time.Now().Add(5 * time.Second)
	for st := r.Coordination(); !st[0].Fallback || st[0].Slots != 1; st = r.Coordination() {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want the fallback share of one slot", st)
		}
		time.Sleep(time.Millisecond)
	}
	ctx := tagging.With(context.Background(), "app", "x")
	cfg, err := rules.Parse([]byte(local))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if st := r.Coordination(); st != nil {
		t.Fatalf("still coordinating after the section was removed: %+v", st)
	}
	if err := run(r.e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("a local budget with max_concurrent 1 and nothing in flight: %v", err)
	}
}

// TestSharedStatementRunsOnItsProvisionalLease: a statement of a shared budget that has no
// lease yet (Redis unreachable, no sync answered) runs at once on its provisional lease, the
// budget over the fallback instances, rather than waiting (max_wait) for a lease: the engine's
// timers are fake and never fire, so a wait would never end. After the first sync fails, the
// budget runs on the same share as its fallback.
func TestSharedStatementRunsOnItsProvisionalLease(t *testing.T) {
	r, _ := newRuntime(t, `
coordination: {redis: "`+deadRedis(t)+`"}
budgets:
  - {name: a, mode: enforce, max_concurrent: 10, max_wait: 1h}
rules:
  - {budget: a, match: {app: x}}
`, func(o *engine.Options) { o.Now = time.Now })
	ctx := tagging.With(context.Background(), "app", "x")
	x := new(engine.Exec)
	if _, err := r.e.Begin(ctx, x, nil, "select 1", nil); err != nil {
		t.Fatalf("the statement: %v", err)
	}
	x.Finish(ctx, nil)
	deadline := time.Now().Add(5 * time.Second)
	for st := r.Coordination(); len(st) != 1 || !st[0].Fallback || st[0].Slots != 1; st = r.Coordination() {
		if time.Now().After(deadline) {
			t.Fatalf("status %+v, want the fallback share (10 slots / 10 instances)", st)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSharedRateUsesServerCores: a shared budget's global rate, which Redis divides among the
// instances, is server_share × server_cores, the rate a local budget drains at, for any
// server_cores, a fraction of a core included; and server_cores' default when a Config built
// in code leaves it out.
func TestSharedRateUsesServerCores(t *testing.T) {
	url := deadRedis(t)
	for _, tt := range []struct {
		name  string
		cores float64
		want  float64
	}{
		{"a fraction of a core", 0.5, 0.25},
		{"several cores", 4, 2},
		{"the default", 0, 0.5 * rules.DefaultServerCores},
	} {
		t.Run(tt.name, func(t *testing.T) {
			share := 0.5
			cfg := &rules.Config{ServerCores: tt.cores, Coordination: &rules.Coordination{Redis: url},
				Budgets: []rules.Budget{{Name: "a", Mode: rules.ModeEnforce, ServerShare: &share}}}
			r, _ := newRuntime(t, "")
			if err := r.SetConfig(cfg); err != nil {
				t.Fatal(err)
			}
			st := r.Coordination()
			if len(st) != 1 {
				t.Fatalf("shared budgets %+v, want a", st)
			}
			local := r.e.Budgets()[0].Spec.Rate
			if got := st[0].LimitsInForce.Rate; got != tt.want || local != tt.want {
				t.Errorf("shared rate %v, local rate %v; want both %v", got, local, tt.want)
			}
		})
	}
}

// Redis unreachable: a shared budget with only a quarantine still quarantines on its own,
// and nothing fails a statement for want of Redis.
func TestQuarantineSharedWithoutRedis(t *testing.T) {
	r, clk := newRuntime(t, "coordination: {redis: \""+deadRedis(t)+"\", sync_interval: 100ms}\n"+`
budgets:
  - {name: r, mode: enforce, max_duration: 300ms, per_query_limit: 10s, quarantine: {after: 2, for: 30s}}
rules:
  - {budget: r, match: {app: r}}
`)
	if st := r.Coordination(); len(st) != 1 || st[0].Name != "r" {
		t.Fatalf("shared budgets %+v, want r (it shares its quarantine)", st)
	}
	ctx := tagging.With(context.Background(), "app", "r")
	if err := run(r.e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("a statement of a shared budget with only a quarantine: %v", err)
	}
	overrun(t, r.e, clk, ctx, "select pg_sleep(5)")
	overrun(t, r.e, clk, ctx, "select pg_sleep(5)")
	if d := denial(t, run(r.e, clk, ctx, "select pg_sleep(5)", 0)); d.Reason != vocab.ReasonQuarantine {
		t.Fatalf("denial %+v", d)
	}
	if err := run(r.e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("another pattern: %v", err)
	}
}
