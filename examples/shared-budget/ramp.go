package main

// The ramp scenario: a shared budget of max_concurrent 64 (no rate), whose statements are
// refused for want of a slot only when the fleet is near the limit. Two parts per run:
//
//   - alone: one process at 8 workers, then 12, then 64: target nothing refused while the
//     process (the whole fleet) has fewer than 64 statements in flight;
//   - fleet: 4 processes at 4 workers each, then the first jumps to 40, then all run 16:
//     target nothing refused while the fleet's in-flight count is below the limit minus one
//     sync's growth, L − G, where G is how much the processes' demand grew over the last
//     sync of the others and the early sync that follows (growth): an instance holds its
//     demand plus an even share of the slots nobody wants, and the headroom others hold
//     moves to an instance that grew past its share at their next sync (internal/coord
//     doc.go, "Slots with headroom"), so a refusal below that bound means slots idle in
//     Redis while a statement is refused.
//
// Each process records when each statement was sent and returned, and when each refused one
// returned (a refusal is decided at once); the fleet's in-flight count at a refusal is the statements of every process sent
// before it and not yet returned (the processes share the machine's clock). The parent also
// samples pg_stat_activity every 10 ms for the most statements running at once. Statements
// are 20 ms of pg_sleep.

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
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// rampLimit is the ramp's max_concurrent; rampStmt its statements' length.
const (
	rampLimit = 64
	rampStmt  = 20 * time.Millisecond
	rampPhase = 3 * time.Second
)

var (
	rampChild  = flag.Bool("ramp-child", false, "run as one process of the ramp scenario (used by the parent)")
	rampPhases = flag.String("phases", "", "ramp child: workers in each phase, comma-separated")
)

// rampPart is one part of the ramp: how many processes and each one's workers per phase.
type rampPart struct {
	name    string
	workers [][]int // [process][phase]
}

var rampParts = []rampPart{
	{"alone", [][]int{{8, 12, 64}}},
	{"fleet", [][]int{{4, 40, 16}, {4, 4, 16}, {4, 4, 16}, {4, 4, 16}}},
}

// rampReport is what a ramp child prints when it ends: when each statement that ran was
// sent and returned, and when each refused one returned, in µs of Unix time.
type rampReport struct {
	Ran      [][2]int64 `json:"ran"`
	Refusals []int64    `json:"refusals"`
	Errors   int        `json:"errors"`
}

// rampResult is one run of one part.
type rampResult struct {
	part  string
	run   int
	ok    int
	errs  int
	total int // refusals
	// below counts the refusals below the part's bound; least is the least fleet in-flight
	// count at a refusal, and bound the bound there (-1: no refusal).
	below, least, bound int
	most                int // the fleet's most statements at once (pg_stat_activity)
	// late is, of the refusals below the bound, the latest into its phase (0: none).
	late time.Duration
}

func (r rampResult) missed() []string {
	var out []string
	if r.below > 0 {
		out = append(out, "refused below the bound")
	}
	if r.most > rampLimit {
		out = append(out, "max_concurrent")
	}
	if r.errs > 0 {
		out = append(out, "errors")
	}
	return out
}

// runRamp runs both parts of the ramp c.runs times and prints their table.
func runRamp(c config, e *env) error {
	var results []rampResult
	for i := range c.runs {
		for _, p := range rampParts {
			fmt.Printf("ramp %s: run %d of %d ...\n", p.name, i+1, c.runs)
			r, err := e.ramp(c, p)
			if err != nil {
				return fmt.Errorf("ramp %s: %w", p.name, err)
			}
			r.run = i + 1
			results = append(results, r)
		}
	}
	fmt.Printf("\nramp: shared max_concurrent %d, sync_interval %s, %s statements, phases of %s; alone: 1 process at 8, 12, 64 workers;\n"+
		"fleet: 4 processes at 4 workers, then the first at 40, then all at 16\n", rampLimit, c.interval, rampStmt, rampPhase)
	fmt.Println("part   run  statements  refused  below bound  least in flight at a refusal (bound)  most in flight  last below, into its phase  targets")
	fmt.Printf("                                  0                                                    <= %d\n", rampLimit)
	for _, r := range results {
		verdict := "met"
		if m := r.missed(); len(m) > 0 {
			verdict = "MISSED: " + strings.Join(m, ", ")
		}
		least := "-"
		if r.least >= 0 {
			least = fmt.Sprintf("%d (%d)", r.least, r.bound)
		}
		late := "-"
		if r.below > 0 {
			late = r.late.Round(time.Millisecond).String()
		}
		fmt.Printf("%-6s %-4d %-11d %-8d %-12d %-38s %-15d %-27s %s\n", r.part, r.run, r.ok, r.total, r.below, least, r.most, late, verdict)
	}
	return nil
}

// rampSlack is how far below its demand the fleet's in-flight count dips on its own: a worker
// between one statement's return and the next one's admission holds no statement, and the
// other processes' workers run back to back.
const rampSlack = 2

// growth is how much the processes' demand (their workers) grew over the span before at:
// for each process, its workers at at less the fewest it had in the span, if more. The
// span is the early sync that tells Redis a starved instance's want (within an eighth of an
// interval), one sync of the others (an interval at most) and the starved instance's next
// early sync (an eighth of an interval), with a little to spare for the calls: an instance
// that grew is refused for want of a slot only until the others' next syncs hand it their
// headroom.
func growth(p rampPart, start, at time.Time, span time.Duration) int {
	phase := func(t time.Time) int { return max(0, min(int(t.Sub(start)/rampPhase), len(p.workers[0])-1)) }
	g := 0
	for _, ws := range p.workers {
		least := ws[phase(at)]
		for t := at.Add(-span); t.Before(at); t = t.Add(10 * time.Millisecond) {
			least = min(least, ws[phase(t)])
		}
		g += ws[phase(at)] - least
	}
	return g
}

// ramp runs one part once.
func (e *env) ramp(c config, p rampPart) (rampResult, error) {
	r := rampResult{part: p.name, least: -1, bound: -1}
	rulesPath := filepath.Join(e.dir, "ramp.yaml")
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(slotRules, e.redis.URL, c.interval, rampLimit)), 0o600); err != nil {
		return r, err
	}
	if err := resetRedis(e.redis.Addr); err != nil {
		return r, err
	}
	phases := len(p.workers[0])
	start := time.Now().Add(3 * time.Second) // every child connected and leased by then
	end := start.Add(time.Duration(phases) * rampPhase)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	smp, err := startSampler(ctx, e.dsn)
	if err != nil {
		return r, err
	}
	kids := make([]*kid, len(p.workers))
	for i, ws := range p.workers {
		k := &kid{id: i}
		phases := make([]string, len(ws))
		for j, w := range ws {
			phases[j] = strconv.Itoa(w)
		}
		k.cmd = exec.Command(e.self, "-ramp-child", "-phases", strings.Join(phases, ","),
			"-dsn", e.dsn, "-id", fmt.Sprint(i), "-start", start.Format(time.RFC3339Nano), "-end", end.Format(time.RFC3339Nano))
		k.cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "PGTRAFFIC_RULES="+rulesPath)
		k.cmd.Stdout = &k.out
		k.cmd.Stderr = os.Stderr
		if err := k.cmd.Start(); err != nil {
			return r, err
		}
		kids[i] = k
	}
	var refusals, starts, ends []int64
	for _, k := range kids {
		if err := k.cmd.Wait(); err != nil {
			return r, fmt.Errorf("child %d: %w", k.id, err)
		}
		var rep rampReport
		if err := json.Unmarshal([]byte(k.out.String()), &rep); err != nil {
			return r, fmt.Errorf("child %d: report: %w", k.id, err)
		}
		r.ok += len(rep.Ran)
		r.errs += rep.Errors
		for _, x := range rep.Ran {
			starts, ends = append(starts, x[0]), append(ends, x[1])
		}
		refusals = append(refusals, rep.Refusals...)
	}
	cancel()
	samples := smp.wait()
	r.total = len(refusals)
	for _, s := range samples {
		if !s.at.Before(start) && s.at.Before(end) {
			r.most = max(r.most, s.running)
		}
	}
	// The fleet's statements in flight at t: those sent at or before t that had not returned
	// (a statement's span from its send to its return holds its slot, and a little more).
	slices.Sort(starts)
	slices.Sort(ends)
	inFlight := func(t int64) int {
		n, _ := slices.BinarySearch(starts, t+1)
		m, _ := slices.BinarySearch(ends, t+1)
		return n - m
	}
	for _, at := range refusals {
		now := inFlight(at)
		bound := rampLimit
		if len(p.workers) > 1 {
			bound -= growth(p, start, time.UnixMicro(at), c.interval*3/2) + rampSlack
		}
		if r.least < 0 || now < r.least {
			r.least, r.bound = now, bound
		}
		if now < bound {
			r.below++
			r.late = max(r.late, time.UnixMicro(at).Sub(start)%rampPhase)
		}
	}
	return r, nil
}

// runRampChild is one process of the ramp: from start, the workers of each phase (phases of
// rampPhase) run rampStmt statements back to back; a refused one is retried after 5 ms. It
// prints its report at end.
func runRampChild(c childConfig, phaseList string) error {
	start, end, err := c.window()
	if err != nil {
		return err
	}
	var phases []int
	for _, f := range strings.Split(phaseList, ",") {
		n, err := strconv.Atoi(f)
		if err != nil {
			return fmt.Errorf("phases: %w", err)
		}
		phases = append(phases, n)
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	db, err := sql.Open(driver.Name, c.dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	most := slices.Max(phases)
	db.SetMaxOpenConns(most + 1)
	db.SetMaxIdleConns(most + 1)
	// Open every connection before the start, so that the ramp measures admission, not
	// connects.
	var conns []*sql.Conn
	for range most {
		cn, err := db.Conn(context.Background())
		if err != nil {
			return err
		}
		conns = append(conns, cn)
	}
	for _, cn := range conns {
		cn.Close()
	}
	query := fmt.Sprintf("select pg_sleep(%g)", rampStmt.Seconds())

	var rep rampReport
	var mu sync.Mutex // protects rep
	var wg sync.WaitGroup
	time.Sleep(time.Until(start))
	for w := range most {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := tagging.With(context.Background(), "app", "shared")
			for now := time.Now(); now.Before(end); now = time.Now() {
				if phase := int(now.Sub(start) / rampPhase); phase >= len(phases) || w >= phases[phase] {
					time.Sleep(time.Millisecond)
					continue
				}
				sent := time.Now().UnixMicro()
				_, err := db.ExecContext(ctx, query)
				var be *driver.BlockedError
				mu.Lock()
				switch {
				case err == nil:
					rep.Ran = append(rep.Ran, [2]int64{sent, time.Now().UnixMicro()})
				case errors.As(err, &be):
					// When it was refused: a statement sent at the same moment may have
					// taken the slot first.
					rep.Refusals = append(rep.Refusals, time.Now().UnixMicro())
				default:
					rep.Errors++
				}
				mu.Unlock()
				if err != nil {
					// Soon, to find the first free slot, but not so soon that the
					// refused workers' retries take the CPU the process's coordinator
					// needs to sync.
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(&rep)
}
