package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// bucket is the resolution of a child's record: windows are measured by sliding over it.
const bucket = 100 * time.Millisecond

type childConfig struct {
	dsn        string
	id         int
	workers    int
	stmt       time.Duration
	start, end string
}

// window is when the child starts and stops its work (-start, -end).
func (c *childConfig) window() (start, end time.Time, err error) {
	if start, err = time.Parse(time.RFC3339Nano, c.start); err != nil {
		return start, end, err
	}
	end, err = time.Parse(time.RFC3339Nano, c.end)
	return start, end, err
}

func (c *childConfig) register() {
	flag.StringVar(&c.dsn, "dsn", "", "child: PostgreSQL DSN")
	flag.IntVar(&c.id, "id", 0, "child: process number")
	flag.IntVar(&c.workers, "workers", 4, "child: concurrent workers")
	flag.DurationVar(&c.stmt, "stmt", 50*time.Millisecond, "child: pg_sleep per statement")
	flag.StringVar(&c.start, "start", "", "child: when to start (RFC 3339)")
	flag.StringVar(&c.end, "end", "", "child: when to stop (RFC 3339)")
}

// childReport is what a child prints when it ends: per bucket (Unix time / bucket), the
// execution seconds of the statements admitted in it, measured client-side.
type childReport struct {
	ID      int               `json:"id"`
	Workers int               `json:"workers"`
	Seconds map[int64]float64 `json:"seconds"`
	OK      int               `json:"ok"`
	Blocked int               `json:"blocked"`
	Errors  int               `json:"errors"`
}

// runChild is one application process: workers that each run pg_sleep statements tagged
// app=shared back to back, and retry a blocked one after its RetryAfter (at least 20 ms), so
// that it offers many times its share. The rules come from PGTRAFFIC_RULES, as with any
// program that only imports the driver.
func runChild(c childConfig) error {
	start, end, err := c.window()
	if err != nil {
		return err
	}
	// Thousands of blocks a second are the point here, not news: keep the log quiet.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	db, err := sql.Open(driver.Name, c.dsn)
	if err != nil {
		return err
	}
	if os.Getenv("SHARED_DEBUG") != "" {
		// The same rules through a connector whose status can be printed: each second, this
		// process's lease of the shared budget (stderr).
		conn, err := driver.NewConnector(c.dsn, driver.WithRulesFile(os.Getenv(driver.EnvRules)))
		if err != nil {
			return err
		}
		db.Close()
		db = sql.OpenDB(conn)
		go func() {
			for range time.Tick(time.Second) {
				snap := conn.Snapshot()
				for _, p := range snap.Patterns {
					fmt.Fprintf(os.Stderr, "child %d pattern %q mean %.4f count %d\n", c.id, p.Query, p.MeanCost, p.Count)
				}
				for _, b := range snap.Budgets {
					if sh := b.Shared; sh != nil {
						fmt.Fprintf(os.Stderr, "%s child %d: rate %.4f burst %.4f slots %d instances %d debt %.3f fallback %v syncs %d failures %d in flight %d blocked %d admitted %d local debt %.3f\n",
							time.Now().Format("05.000"), c.id, sh.Rate, sh.Burst, sh.Slots, sh.Instances, sh.GlobalDebt, sh.Fallback, sh.Syncs, sh.Failures, b.InFlight, b.Blocked, b.Admitted, b.Debt)
					}
				}
			}
		}()
	}
	defer db.Close()
	db.SetMaxOpenConns(c.workers + 1)
	db.SetMaxIdleConns(c.workers + 1)
	if err := db.Ping(); err != nil {
		return err
	}
	query := fmt.Sprintf("select pg_sleep(%g)", c.stmt.Seconds())

	rep := childReport{ID: c.id, Workers: c.workers, Seconds: map[int64]float64{}}
	var mu sync.Mutex // protects rep
	var wg sync.WaitGroup
	time.Sleep(time.Until(start))
	for range c.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := tagging.With(context.Background(), "app", "shared")
			for time.Now().Before(end) {
				t0 := time.Now()
				_, err := db.ExecContext(ctx, query)
				d := time.Since(t0)
				var be *driver.BlockedError
				mu.Lock()
				switch {
				case err == nil:
					rep.OK++
					rep.Seconds[t0.UnixNano()/int64(bucket)] += d.Seconds()
				case errors.As(err, &be):
					rep.Blocked++
				default:
					rep.Errors++
				}
				mu.Unlock()
				if err != nil {
					wait := 20 * time.Millisecond
					if be != nil {
						wait = min(max(be.RetryAfter, wait), 200*time.Millisecond)
					}
					time.Sleep(wait)
				}
			}
		}()
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(&rep)
}
