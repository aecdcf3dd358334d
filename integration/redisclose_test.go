package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/delayproxy"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestCloseMidSyncLogsNoRedisOutage: closing a Pool whose shared budgets are
// mid-sync (every rolling deploy closes one) must not log "Redis unreachable". pgtraffic
// logs that warning when Redis cannot be reached and the budgets fall back to their leases
// and an even share; operators alert on it. Close cancels the sync in flight, and that
// cancellation ("context canceled") is the coordinator's own doing, not a Redis outage:
// Redis answered every call (here 30 ms away, well within every deadline). A reload that
// replaces or removes the coordination section stops a sync the same way. The test closes a
// pool at a spread of moments in its sync cycle and fails when any close logs the outage.
func TestCloseMidSyncLogsNoRedisOutage(t *testing.T) {
	srv := redistest.Need(t)
	px := delayproxy.Start(t, srv.Addr, 30*time.Millisecond)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	cfg, err := driver.ParseConfig([]byte(`coordination: {redis: "redis://` + px.Addr + `/0", sync_interval: 400ms}
budgets:
  - {name: b, mode: enforce, max_concurrent: 2, per: tenant}
  - {name: g, mode: enforce, max_concurrent: 3}
rules: [{budget: b, match: {app: x}}, {budget: g, match: {app: x}}]`))
	if err != nil {
		t.Fatal(err)
	}
	for round := 0; round < 12; round++ {
		var logs lockedBuffer
		p, err := driver.NewPool(context.Background(), dsn, driver.WithConfig(cfg), driver.WithLogger(logs.logger()))
		if err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 10; j++ {
			ctx := tagging.With(context.Background(), "app", "x", "tenant", string(rune('a'+j)))
			if _, err := p.Exec(ctx, "select 1"); err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		time.Sleep(400*time.Millisecond + time.Duration(round*37)*time.Millisecond)
		before := len(logs.String())
		p.Close()
		atClose := logs.String()[before:]
		for _, line := range strings.Split(atClose, "\n") {
			if strings.Contains(line, "Redis unreachable") {
				t.Fatalf("round %d: closing the pool logged a Redis outage while Redis answered every call:\n%s", round, line)
			}
		}
	}
}
