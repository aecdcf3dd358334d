package engine

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// deadRedis is a redis:// URL that nothing listens on: the coordinator runs in fallback.
func deadRedis(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return "redis://" + l.Addr().String() + "/0"
}

func TestCoordinationWithoutRedisIsAnError(t *testing.T) {
	e, _ := newEngine(t, "")
	cfg, err := rules.Parse([]byte("coordination: {sync_interval: 1s}\nbudgets:\n  - {name: a, max_concurrent: 1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetConfig(cfg); err == nil || !strings.Contains(err.Error(), "no redis URL") {
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
	e, clk := newEngine(t, "coordination: {redis: \""+url+"\"}\n"+local)
	st := e.Coordination()
	if len(st) != 1 || st[0].Name != "a" {
		t.Fatalf("shared budgets %+v, want only a (q has nothing to share)", st)
	}
	if e.Instance() == "" {
		t.Error("no instance id while coordinating")
	}
	// Without a lease (Redis unreachable, no sync yet) a has no slot.
	ctx := tagging.With(context.Background(), "app", "x")
	if err := run(e, clk, ctx, "select 1", 0); err == nil {
		t.Fatal("a shared budget without a lease admitted a statement")
	}
	cfg, err := rules.Parse([]byte(local))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.SetConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if st := e.Coordination(); st != nil {
		t.Fatalf("still coordinating after the section was removed: %+v", st)
	}
	if err := run(e, clk, ctx, "select 1", 0); err != nil {
		t.Fatalf("a local budget with max_concurrent 1 and nothing in flight: %v", err)
	}
}

// TestMaxWaitWakesOnALease: a statement waiting (max_wait) in a shared budget without a lease
// runs as soon as a lease arrives, not when its wait runs out: the engine's timers are fake and
// never fire (its clock is real, for the coordinator's schedule), so only the lease can wake
// it. (Redis is unreachable: the lease is the fallback share, which the coordinator sets after
// its first sync fails.)
func TestMaxWaitWakesOnALease(t *testing.T) {
	e, _ := newEngine(t, `
coordination: {redis: "`+deadRedis(t)+`"}
budgets:
  - {name: a, mode: enforce, max_concurrent: 10, max_wait: 1h}
rules:
  - {budget: a, match: {app: x}}
`, func(o *Options) { o.Now = time.Now })
	ctx := tagging.With(context.Background(), "app", "x")
	x := new(Exec)
	if _, err := e.Begin(ctx, x, nil, "select 1", nil); err != nil {
		t.Fatalf("the waiting statement: %v", err)
	}
	x.Finish(ctx, nil)
	if st := e.Coordination(); len(st) != 1 || !st[0].Fallback || st[0].Slots != 1 {
		t.Fatalf("status %+v, want the fallback share (10 slots / 10 instances)", st)
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
			e, _ := newEngine(t, "")
			if err := e.SetConfig(cfg); err != nil {
				t.Fatal(err)
			}
			st := e.Coordination()
			if len(st) != 1 {
				t.Fatalf("shared budgets %+v, want a", st)
			}
			local := e.Budgets()[0].Spec.Rate
			if got := st[0].LimitsInForce.Rate; got != tt.want || local != tt.want {
				t.Errorf("shared rate %v, local rate %v; want both %v", got, local, tt.want)
			}
		})
	}
}
