// Command shared-budget is pgtraffic's shared-budget experiment: several
// application processes (GOMAXPROCS=1 each) share one PostgreSQL, one redis-server and one
// budget, coordinated through Redis, and each offers at least ten times the budget in
// pg_sleep statements, whose execution time does not depend on CPU contention.
//
// For each scenario it measures, from the processes' own records of the statements they ran,
// the aggregate admitted execution seconds per second against server_share × server_cores,
// the largest 1-second window against rate + burst and Jain's fairness index over the
// processes; and, from pg_stat_activity sampled every 10 ms, how many of the budget's
// statements ran at once against max_concurrent. Scenarios:
//
//   - single: one process under the same budget (the reference);
//   - equal: 8 processes, equal demand;
//   - 10:1: 4 processes offering ten times what the other 4 offer;
//   - slots: 8 processes under a budget of max_concurrent 4 only;
//   - sigstop: equal, with redis-server stopped (SIGSTOP) for 5 s mid-run;
//   - restart: equal, with redis-server killed (SIGKILL) and started again, empty;
//   - kill: slots, with one process killed (SIGKILL) mid-run: its slots must come back
//     within 3 sync intervals;
//   - election: one health sampler for every process, and another after it is killed
//     (election.go);
//   - ramp: a shared max_concurrent of 64, one process ramping from 8 to 12 to 64 workers,
//     then 4 processes of which one jumps: refused only near the limit (ramp.go);
//   - tenants: one budget per: tenant with 100,000 active tenants on one instance: every
//     partition renewed every interval, no failure (tenants.go).
//
// Each scenario runs -runs times and the table shows every run, each checked against the
// targets; the chart shows the median run (by aggregate rate).
//
//	go run . -runs 5                # from examples/shared-budget; or make shared
//
// Set PGTRAFFIC_TEST_DSN to use an existing PostgreSQL instead of a throwaway one. It exits
// non-zero only on errors, never on a missed target. The same binary is the child process,
// run with -child by the parent.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// appName marks the experiment's connections in pg_stat_activity.
const appName = "shared-budget"

// The budgets. rate: half a core's execution time shared by every process, in 50 ms
// statements; slots: four statements at once across every process, in 200 ms statements.
const (
	rateRules = `server_cores: 1
coordination:
  redis: %s
  sync_interval: %s
budgets:
  - name: shared
    mode: enforce
    server_share: %g
    burst_limit: %s
rules:
  - budget: shared
    match: {app: shared}
`
	slotRules = `coordination:
  redis: %s
  sync_interval: %s
budgets:
  - name: shared
    mode: enforce
    max_concurrent: %d
rules:
  - budget: shared
    match: {app: shared}
`
)

type config struct {
	procs      int
	duration   time.Duration
	warmup     time.Duration
	runs       int
	share      float64
	burst      time.Duration
	slots      int
	interval   time.Duration
	rateStmt   time.Duration
	slotStmt   time.Duration
	only       []string // the scenarios -only names; nil for all
	chart      string
	chaosAt    time.Duration
	chaosFor   time.Duration
	childFlags childConfig
}

func main() {
	var c config
	flag.IntVar(&c.procs, "procs", 8, "application processes")
	flag.DurationVar(&c.duration, "duration", 30*time.Second, "length of one run")
	// Long enough for the leases to settle (a few sync intervals): the steady-state columns
	// leave it out; "from start" does not.
	flag.DurationVar(&c.warmup, "warmup", 10*time.Second, "start of a run left out of the figures")
	flag.IntVar(&c.runs, "runs", 5, "runs per scenario (each is shown; the chart shows the median)")
	flag.Float64Var(&c.share, "share", 0.5, "server_share of the rate budget (server_cores 1)")
	flag.DurationVar(&c.burst, "burst", time.Second, "burst_limit of the rate budget")
	flag.IntVar(&c.slots, "slots", 4, "max_concurrent of the slot budget")
	flag.DurationVar(&c.interval, "interval", time.Second, "coordination sync_interval")
	flag.DurationVar(&c.rateStmt, "rate-stmt", 50*time.Millisecond, "pg_sleep of a rate-budget statement")
	flag.DurationVar(&c.slotStmt, "slot-stmt", 200*time.Millisecond, "pg_sleep of a slot-budget statement")
	flag.Func("only", "comma-separated scenarios to run (default all)", func(v string) (err error) {
		c.only, err = parseOnly(v)
		return err
	})
	flag.DurationVar(&c.chaosAt, "chaos-at", 15*time.Second, "when the chaos starts in a run")
	flag.DurationVar(&c.chaosFor, "chaos-for", 5*time.Second, "how long redis stays stopped (sigstop)")
	flag.StringVar(&c.chart, "chart", "", "write a PNG chart of the rate runs to this file")
	child := flag.Bool("child", false, "run as one application process (used by the parent)")
	c.childFlags.register()
	flag.Parse()
	log.SetFlags(0)

	if *child {
		if err := runChild(c.childFlags); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *rampChild {
		if err := runRampChild(c.childFlags, *rampPhases); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *electionChild {
		if err := runElectionChild(c.childFlags, *electionStatus); err != nil {
			log.Fatal(err)
		}
		return
	}
	if err := runParent(c); err != nil {
		log.Fatal(err)
	}
}

// env is what the runs share: the servers and a directory for rules files.
type env struct {
	dsn   string
	redis *redistest.Server
	dir   string
	self  string
}

func runParent(c config) error {
	dsn, stopPG, err := pgtest.EnvOrStart()
	if err != nil {
		return err
	}
	defer stopPG()
	fmt.Println("starting a throwaway redis-server ...")
	rs, err := redistest.Start()
	if err != nil {
		return err
	}
	defer rs.Stop()
	dir, err := os.MkdirTemp("", "shared-budget-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	e := &env{dsn: withAppName(dsn), redis: rs, dir: dir, self: self}

	var results, every []result
	for _, s := range scenarios(c) {
		if !c.selected(s.name) {
			continue
		}
		var runs []result
		for i := range c.runs {
			fmt.Printf("%s: run %d of %d ...\n", s.name, i+1, c.runs)
			r, err := e.run(c, s)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			r.run = i + 1
			fmt.Println("  " + r.summary(c))
			runs = append(runs, r)
		}
		every = append(every, runs...)
		results = append(results, median(slices.Clone(runs)))
	}
	if len(every) > 0 {
		printTable(os.Stdout, c, every)
	}
	for _, s := range laterScenarios {
		if !c.selected(s.name) {
			continue
		}
		if err := s.run(c, e); err != nil {
			return err
		}
	}
	if c.chart != "" {
		return writeChart(c.chart, c, results)
	}
	return nil
}

// laterScenarios run after the table of scenarios, each printing a table of its own.
var laterScenarios = []struct {
	name string
	run  func(config, *env) error
}{{"election", runElection}, {"ramp", runRamp}, {"tenants", runTenants}}

// parseOnly returns the scenarios named by -only, a comma-separated list whose names may be
// padded with spaces; nil (every scenario) for an empty list. A name that is no scenario's is
// an error, which the flag package prints before exiting with status 2: a typo must not pass
// for a run.
func parseOnly(only string) ([]string, error) {
	if strings.TrimSpace(only) == "" {
		return nil, nil
	}
	var known []string
	for _, s := range scenarios(config{}) {
		known = append(known, s.name)
	}
	for _, s := range laterScenarios {
		known = append(known, s.name)
	}
	var names []string
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		if !slices.Contains(known, name) {
			return nil, fmt.Errorf("unknown scenario %q (the scenarios: %s)", name, strings.Join(known, ", "))
		}
		names = append(names, name)
	}
	return names, nil
}

// selected reports whether the scenario name is to run.
func (c config) selected(name string) bool { return c.only == nil || slices.Contains(c.only, name) }

// scenario is one experiment: how many processes, how many workers each, which budget, and
// what goes wrong mid-run.
type scenario struct {
	name    string
	procs   int
	workers func(i int) int
	slots   bool                            // the slot budget, else the rate budget
	chaos   func(e *env, kids []*kid) error // at chaosAt; nil for none
	undo    func(e *env) error              // chaosFor after chaos; nil for none
	big     func(i int) bool                // the big processes of an unequal run
}

func scenarios(c config) []scenario {
	even := func(int) int { return 4 }
	return []scenario{
		{name: "single", procs: 1, workers: even},
		{name: "equal", procs: c.procs, workers: even},
		{name: "10:1", procs: c.procs, big: func(i int) bool { return i < c.procs/2 },
			workers: func(i int) int {
				if i < c.procs/2 {
					return 10
				}
				return 1
			}},
		{name: "slots", procs: c.procs, workers: even, slots: true},
		{name: "sigstop", procs: c.procs, workers: even,
			chaos: func(e *env, _ []*kid) error { return e.redis.Pause() },
			undo:  func(e *env) error { return e.redis.Resume() }},
		{name: "restart", procs: c.procs, workers: even,
			chaos: func(e *env, _ []*kid) error { return e.redis.Restart() }},
		{name: "kill", procs: c.procs, workers: even, slots: true,
			chaos: func(_ *env, kids []*kid) error { return kids[0].cmd.Process.Kill() }},
	}
}

// kid is a running child process.
type kid struct {
	id  int
	cmd *exec.Cmd
	out strings.Builder
}

// run runs one scenario once.
func (e *env) run(c config, s scenario) (result, error) {
	rulesPath := filepath.Join(e.dir, s.name+".yaml")
	var rules string
	if s.slots {
		rules = fmt.Sprintf(slotRules, e.redis.URL, c.interval, c.slots)
	} else {
		rules = fmt.Sprintf(rateRules, e.redis.URL, c.interval, c.share, c.burst)
	}
	if err := os.WriteFile(rulesPath, []byte(rules), 0o600); err != nil {
		return result{}, err
	}
	stmt := c.rateStmt
	if s.slots {
		stmt = c.slotStmt
	}
	start := time.Now().Add(2 * time.Second) // every child connected and warm by then
	end := start.Add(c.duration)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sampler, err := startSampler(ctx, e.dsn)
	if err != nil {
		return result{}, err
	}

	// Each run starts from an empty Redis, as a cold start: a run must not inherit the
	// previous run's global debt or its instances' entries (which, a few seconds old, make
	// the first sync see an outage and keep their shares free for them). Redis's call
	// counters start from zero too: calls per process per second are counted over the run.
	if err := resetRedis(e.redis.Addr); err != nil {
		return result{}, err
	}
	spawned := time.Now()
	kids := make([]*kid, s.procs)
	for i := range kids {
		k := &kid{id: i}
		k.cmd = exec.Command(e.self, "-child",
			"-dsn", e.dsn, "-id", fmt.Sprint(i), "-workers", fmt.Sprint(s.workers(i)),
			"-stmt", stmt.String(), "-start", start.Format(time.RFC3339Nano), "-end", end.Format(time.RFC3339Nano))
		k.cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "PGTRAFFIC_RULES="+rulesPath)
		k.cmd.Stdout = &k.out
		k.cmd.Stderr = os.Stderr
		if err := k.cmd.Start(); err != nil {
			return result{}, err
		}
		kids[i] = k
	}

	// The chaos lasts from chaosTime to chaosEnd: chaosFor for a scenario that undoes it (a
	// stopped Redis resumed), else as long as its action takes (a restart ends when the new
	// redis-server answers; a kill at once).
	var chaosTime, chaosEnd time.Time
	var chaosErr error
	var wg sync.WaitGroup
	if s.chaos != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { chaosEnd = time.Now() }()
			time.Sleep(time.Until(start.Add(c.chaosAt)))
			chaosTime = time.Now()
			if chaosErr = s.chaos(e, kids); chaosErr != nil || s.undo == nil {
				return
			}
			time.Sleep(c.chaosFor)
			chaosErr = s.undo(e)
		}()
	}

	var reports []childReport
	for _, k := range kids {
		err := k.cmd.Wait()
		if s.name == "kill" && k.id == 0 {
			continue // killed on purpose: its statements are in pg_stat_activity, not in a report
		}
		if err != nil {
			return result{}, fmt.Errorf("child %d: %w", k.id, err)
		}
		var rep childReport
		if err := json.Unmarshal([]byte(k.out.String()), &rep); err != nil {
			return result{}, fmt.Errorf("child %d: report: %w", k.id, err)
		}
		reports = append(reports, rep)
	}
	wg.Wait()
	cancel()
	samples := sampler.wait()
	if chaosErr != nil {
		return result{}, chaosErr
	}
	r := analyse(c, s, start.Add(c.warmup), end, chaosTime, chaosEnd, reports, samples)
	if calls, err := scriptCalls(e.redis.Addr); err == nil {
		r.callsPerProc = float64(calls) / float64(s.procs) / time.Since(spawned).Seconds()
	}
	return r, nil
}

// resetRedis empties Redis and zeroes its command counters.
func resetRedis(addr string) error {
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	ctx := context.Background()
	if err := rc.FlushAll(ctx).Err(); err != nil {
		return err
	}
	return rc.ConfigResetStat(ctx).Err()
}

// scriptCalls is how many script calls (EVAL, EVALSHA and their read-only forms) Redis ran
// since resetRedis: every sync is one.
func scriptCalls(addr string) (int64, error) {
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_eval") {
			continue
		}
		var calls int64
		if _, err := fmt.Sscanf(rest, "calls=%d", &calls); err == nil {
			n += calls
		}
	}
	return n, nil
}

// sampler reads pg_stat_activity every 10 ms on its own connection.
type sampler struct {
	done    chan struct{}
	mu      sync.Mutex // protects samples
	samples []sample
}

type sample struct {
	at      time.Time
	running int // the budget's statements active on the server
}

func startSampler(ctx context.Context, dsn string) (*sampler, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	s := &sampler{done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer conn.Close(context.Background())
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			var n int
			err := conn.QueryRow(ctx, `select count(*) from pg_stat_activity
				where application_name = $1 and state = 'active' and query like '%pg_sleep%' and pid <> pg_backend_pid()`,
				appName).Scan(&n)
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.samples = append(s.samples, sample{time.Now(), n})
			s.mu.Unlock()
		}
	}()
	return s, nil
}

func (s *sampler) wait() []sample {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.samples
}

// withAppName sets application_name on a DSN, URL or keyword/value.
func withAppName(dsn string) string {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "application_name=" + appName
	}
	return dsn + " application_name=" + appName
}
