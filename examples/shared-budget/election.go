package main

// The election scenario: -procs processes share a coordination section and a budget with
// throttle_when on a custom health query that calls nextval, so the server counts every health
// query. Each process checks the budget every 10 ms. After a warm-up the parent counts the
// health queries over 20 health intervals, then kills (SIGKILL) the process that samples: its
// lease lapses and another process takes over. Targets per run:
//
//   - at most one health query per interval in the steady window, by one process;
//   - another process samples within three intervals of the kill;
//   - at most two health queries in any one interval around the handover;
//   - no check refused by any surviving process (a refusal here means a stale sample).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const electionRules = `coordination:
  redis: %s
  sync_interval: %s
health_interval: %s
health_queries: {probe: "select 0 * nextval('pgtraffic_health_probe')"}
budgets:
  - {name: guarded, mode: enforce, throttle_when: {custom.probe: 1}}
rules:
  - {budget: guarded, match: {app: guarded}}
`

// Election flags: the parent's health interval, and the child's.
var (
	healthInterval = flag.Duration("health-interval", 500*time.Millisecond, "health_interval of the election scenario")
	electionChild  = flag.Bool("election-child", false, "run as one process of the election scenario (used by the parent)")
	electionStatus = flag.String("status", "", "election child: file to write its health sample count to")
)

// electionSteady is the window counted, in health intervals.
const electionSteady = 20

// electionResult is one run of the election scenario.
type electionResult struct {
	run       int
	intervals float64 // length of the steady window, in health intervals
	queries   int64   // health queries the server ran in it
	samplers  int     // processes that sampled in it
	takeover  float64 // intervals from the kill until another process sampled
	peak      int64   // most health queries in one interval from one before the kill to the end
	refused   int     // checks refused by the surviving processes
}

// missed names the targets r missed.
func (r electionResult) missed() []string {
	var out []string
	for _, m := range []struct {
		ok   bool
		name string
	}{
		{float64(r.queries) <= r.intervals+1, "queries/interval"},
		{r.samplers == 1, "samplers"},
		{r.takeover > 0 && r.takeover <= 3, "takeover"},
		{r.peak <= 2, "peak"},
		{r.refused == 0, "refused"},
	} {
		if !m.ok {
			out = append(out, m.name)
		}
	}
	return out
}

// runElection runs the election scenario c.runs times and prints its table.
func runElection(c config, e *env) error {
	var results []electionResult
	for i := range c.runs {
		fmt.Printf("election: run %d of %d ...\n", i+1, c.runs)
		r, err := e.election(c)
		if err != nil {
			return fmt.Errorf("election: %w", err)
		}
		r.run = i + 1
		results = append(results, r)
		fmt.Printf("  %.2f queries/interval by %d process(es); takeover after %.1f intervals; peak %d/interval; %d refused\n",
			float64(r.queries)/r.intervals, r.samplers, r.takeover, r.peak, r.refused)
	}
	fmt.Printf("\nelection: %d processes, health_interval %s, sync_interval %s; the sampling process killed (SIGKILL)\n",
		c.procs, *healthInterval, c.interval)
	fmt.Println("run  queries/interval  samplers  takeover (intervals)  peak queries/interval  refused  targets")
	fmt.Println("     <= 1              1         <= 3                  <= 2                   0")
	for _, r := range results {
		verdict := "met"
		if m := r.missed(); len(m) > 0 {
			verdict = "MISSED: " + strings.Join(m, ", ")
		}
		fmt.Printf("%-4d %-17.2f %-9d %-21.1f %-22d %-8d %s\n", r.run, float64(r.queries)/r.intervals, r.samplers,
			r.takeover, r.peak, r.refused, verdict)
	}
	return nil
}

// election runs the scenario once.
func (e *env) election(c config) (electionResult, error) {
	ctx := context.Background()
	hi := *healthInterval
	admin, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		return electionResult{}, err
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "create sequence if not exists pgtraffic_health_probe"); err != nil {
		return electionResult{}, err
	}
	probes := func() (int64, error) {
		var n int64
		err := admin.QueryRow(ctx, "select last_value from pgtraffic_health_probe").Scan(&n)
		return n, err
	}
	if err := resetRedis(e.redis.Addr); err != nil {
		return electionResult{}, err
	}
	rulesPath := filepath.Join(e.dir, "election.yaml")
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(electionRules, e.redis.URL, c.interval, hi)), 0o600); err != nil {
		return electionResult{}, err
	}
	start := time.Now().Add(2 * time.Second)
	steadyFrom := start.Add(5 * hi)
	killAt := steadyFrom.Add(electionSteady * hi)
	end := killAt.Add(10 * hi)
	kids := make([]*kid, c.procs)
	status := make([]string, c.procs)
	for i := range kids {
		k := &kid{id: i}
		status[i] = filepath.Join(e.dir, fmt.Sprintf("election-%d", i))
		os.Remove(status[i])
		k.cmd = exec.Command(e.self, "-election-child", "-status", status[i],
			"-dsn", e.dsn, "-id", fmt.Sprint(i), "-start", start.Format(time.RFC3339Nano), "-end", end.Format(time.RFC3339Nano))
		k.cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "PGTRAFFIC_RULES="+rulesPath)
		k.cmd.Stdout = &k.out
		k.cmd.Stderr = os.Stderr
		if err := k.cmd.Start(); err != nil {
			return electionResult{}, err
		}
		kids[i] = k
	}
	defer func() {
		for _, k := range kids {
			if k.cmd.ProcessState == nil {
				k.cmd.Process.Kill()
				k.cmd.Wait()
			}
		}
	}()
	samples := func() []int64 {
		out := make([]int64, len(status))
		for i, f := range status {
			b, _ := os.ReadFile(f)
			out[i], _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		return out
	}

	// Poll the sequence and the status files every 10 ms from the steady window to the end;
	// kill the process that sampled in the steady window at killAt.
	type point struct {
		at time.Time
		n  int64
	}
	var r electionResult
	var history []point
	var s0, atKill []int64
	var killed time.Time
	lead := -1
	time.Sleep(time.Until(steadyFrom))
	for time.Now().Before(end) {
		n, err := probes()
		if err != nil {
			return r, err
		}
		now := time.Now()
		history = append(history, point{now, n})
		cur := samples()
		switch {
		case s0 == nil:
			s0 = cur
		case lead < 0 && !now.Before(killAt):
			r.intervals = float64(now.Sub(history[0].at)) / float64(hi)
			r.queries = n - history[0].n
			for i := range cur {
				if cur[i] > s0[i] {
					r.samplers++
					if lead < 0 || cur[i]-s0[i] > cur[lead]-s0[lead] {
						lead = i
					}
				}
			}
			if lead < 0 {
				return r, fmt.Errorf("no process sampled in the steady window")
			}
			killed = time.Now()
			if err := kids[lead].cmd.Process.Kill(); err != nil {
				return r, err
			}
			kids[lead].cmd.Wait()
			atKill = samples()
		case lead >= 0 && r.takeover == 0:
			for i, v := range cur {
				if i != lead && v > atKill[i] {
					r.takeover = float64(now.Sub(killed)) / float64(hi)
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	if lead < 0 {
		return r, fmt.Errorf("the run ended before the kill")
	}
	for i, p := range history {
		if p.at.Before(killed.Add(-hi)) {
			continue
		}
		for _, q := range history[i:] {
			if q.at.Sub(p.at) <= hi {
				r.peak = max(r.peak, q.n-p.n)
			}
		}
	}
	for _, k := range kids {
		if k.id == lead {
			continue
		}
		if err := k.cmd.Wait(); err != nil {
			return r, fmt.Errorf("child %d: %w", k.id, err)
		}
		var rep electionReport
		if err := json.Unmarshal([]byte(k.out.String()), &rep); err != nil {
			return r, fmt.Errorf("child %d: report: %w", k.id, err)
		}
		r.refused += rep.Refused
	}
	return r, nil
}

// electionReport is what an election child prints when it ends.
type electionReport struct {
	Checks  int `json:"checks"`
	Refused int `json:"refused"`
}

// runElectionChild is one process of the election scenario: a connector with the rules of
// PGTRAFFIC_RULES checks the guarded budget every 10 ms from start to end, and writes its
// count of health samples (pgtraffic.health.samples: queries it ran itself) to the status file
// every 10 ms.
func runElectionChild(c childConfig, statusFile string) error {
	start, end, err := c.window()
	if err != nil {
		return err
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	conn, err := driver.NewConnector(c.dsn, driver.WithRulesFile(os.Getenv(driver.EnvRules)), driver.WithMeterProvider(mp),
		driver.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx := tagging.With(context.Background(), "app", "guarded")
	var rep electionReport
	for now := time.Now(); now.Before(end); now = time.Now() {
		if !now.Before(start) {
			rep.Checks++
			if conn.Check(ctx) != nil {
				rep.Refused++
			}
		}
		if err := writeSamples(reader, statusFile); err != nil {
			return err
		}
		time.Sleep(10 * time.Millisecond)
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// writeSamples writes the pgtraffic.health.samples total to file, atomically.
func writeSamples(reader *sdkmetric.ManualReader, file string) error {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		return err
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "pgtraffic.health.samples" {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(n, 10)), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}
