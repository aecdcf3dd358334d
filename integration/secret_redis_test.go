package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSecretRedisURL runs shared budgets (and the health election) through Redis URLs
// holding passwords: a right one, a wrong one, and one to an unreachable address, and looks
// for the passwords in the logs (debug level), the status page and the Snapshot.
func TestSecretRedisURL(t *testing.T) {
	srv := redistest.Need(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer rc.Close()
	if err := rc.Do(context.Background(), "ACL", "SETUSER", "leakuser", "on", ">S3CRET-PW-OK", "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	defer rc.Do(context.Background(), "ACL", "DELUSER", "leakuser")
	dsn := pgtest.Shared(t).CreateDatabase(t)
	urls := map[string]string{
		"right":       "redis://leakuser:S3CRET-PW-OK@" + srv.Addr + "/0",
		"wrong":       "redis://leakuser:S3CRET-PW-WRONG@" + srv.Addr + "/0",
		"unreachable": "redis://u:S3CRET-PW-DOWN@127.0.0.1:1/0",
		"query":       "redis://" + srv.Addr + "/0?client_name=S3CRET-QUERY&password=S3CRET-QPW",
	}
	for name, u := range urls {
		t.Run(name, func(t *testing.T) {
			rules := fmt.Sprintf(`
coordination: {redis: %q, sync_interval: 100ms}
budgets:
  - {name: one, mode: enforce, max_concurrent: 2, throttle_when: {active_queries: 1000}}
rules:
  - {budget: one, match: {app: shared}}
`, u)
			cfg, err := driver.ParseConfig([]byte(rules))
			if err != nil {
				if strings.Contains(err.Error(), "S3CRET") {
					t.Errorf("ParseConfig error leaks: %v", err)
				}
				t.Skipf("rules rejected: %v", err)
			}
			if s := fmt.Sprintf("%v %+v %#v", cfg, cfg, cfg); strings.Contains(s, "S3CRET") {
				t.Errorf("formatting the Config leaks: %s", excerpt(s, "S3CRET"))
			}
			var logs lockedBuffer
			c, err := driver.NewConnector(dsn, driver.WithConfig(cfg),
				driver.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
			if err != nil {
				if strings.Contains(err.Error(), "S3CRET") {
					t.Errorf("NewConnector error leaks: %v", err)
				}
				return
			}
			db := sql.OpenDB(c)
			defer db.Close()
			ctx := tagging.With(context.Background(), "app", "shared")
			deadline := time.Now().Add(1500 * time.Millisecond)
			for time.Now().Before(deadline) {
				_, err := db.ExecContext(ctx, "select 1")
				if err != nil && strings.Contains(err.Error(), "S3CRET") {
					t.Errorf("statement error leaks: %v", err)
				}
				time.Sleep(50 * time.Millisecond)
			}
			h := c.Handler()
			for _, accept := range []string{"application/json", "text/html"} {
				req := httptest.NewRequest("GET", "/", nil)
				req.Header.Set("Accept", accept)
				w := httptest.NewRecorder()
				h.ServeHTTP(w, req)
				body, _ := io.ReadAll(w.Result().Body)
				if strings.Contains(string(body), "S3CRET") {
					t.Errorf("status (%s) leaks: %s", accept, excerpt(string(body), "S3CRET"))
				}
			}
			snap, _ := json.Marshal(c.Snapshot())
			if strings.Contains(string(snap), "S3CRET") {
				t.Errorf("Snapshot leaks: %s", excerpt(string(snap), "S3CRET"))
			}
			db.Close()
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, "S3CRET") {
					t.Errorf("log leaks: %s", line)
				}
			}
		})
	}
}
