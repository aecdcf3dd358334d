package main

// The tenants scenario: one shared budget `per: tenant` with 100,000 active tenants on one
// instance, against the experiment's redis-server. It runs in the parent process: the real
// coordinator (its own loop, a client made from the coordination URL as a connector makes it)
// steers the real local budget, and a driver goroutine admits and releases a statement of
// every tenant each second, so every partition stays active. A client beside the
// coordinator's records, for every script call, the partitions it carried, so that each
// partition's renewals are seen exactly. Targets per run, after a warm-up:
//
//   - every sync inside its interval: no partition waits longer between two renewals than
//     the interval (each instance's regular syncs keep a grid) plus a fifth of an interval
//     (a partition's place in a sync moves as the sync's length does);
//   - no sync failed and the budget never fell back;
//   - no statement refused (a partition without a lease, or a lapsed one, refuses).
//
// The budget's status is read once, at the end (it walks every partition under the
// coordinator's lock). It also shows Redis's CPU time per second (INFO cpu: the share of its one thread the
// budget takes) and its memory.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/coord"
)

const (
	tenantCount  = 100_000
	tenantRun    = 25 * time.Second
	tenantWarmup = 5 * time.Second
)

// tenantResult is one run of the tenants scenario.
type tenantResult struct {
	run        int
	partitions int           // partitions renewed after the warm-up
	p50, worst time.Duration // median and longest wait of a partition between two renewals
	calls      int           // script calls per second
	cpu        float64       // Redis CPU seconds per second
	memory     float64       // Redis used_memory, MB, at the end
	failures   uint64
	fallback   bool
	refused    int
	admitted   int
}

func (r tenantResult) missed(interval time.Duration) []string {
	var out []string
	if r.worst > interval*12/10 || r.partitions < tenantCount {
		out = append(out, "inside the interval")
	}
	if r.failures > 0 || r.fallback {
		out = append(out, "failures")
	}
	if r.refused > 0 {
		out = append(out, "refused")
	}
	return out
}

// runTenants runs the tenants scenario c.runs times and prints its table.
func runTenants(c config, e *env) error {
	var results []tenantResult
	for i := range c.runs {
		fmt.Printf("tenants: run %d of %d ...\n", i+1, c.runs)
		r, err := e.tenants(c)
		if err != nil {
			return fmt.Errorf("tenants: %w", err)
		}
		r.run = i + 1
		results = append(results, r)
		fmt.Printf("  renewal p50 %v, worst %v; %d failures; Redis CPU %.2f s/s\n", r.p50, r.worst, r.failures, r.cpu)
	}
	fmt.Printf("\ntenants: one budget per: tenant, %d active tenants on one instance, sync_interval %s, %s runs (the first %s left out)\n",
		tenantCount, c.interval, tenantRun, tenantWarmup)
	fmt.Println("run  partitions  renewal p50  renewal worst  failures  fallback  refused  admitted  calls/s  Redis CPU s/s  Redis MB  targets")
	fmt.Printf("     %-11d %-12s <= %-11s 0         false     0\n", tenantCount, "", c.interval*12/10)
	for _, r := range results {
		verdict := "met"
		if m := r.missed(c.interval); len(m) > 0 {
			verdict = "MISSED: " + strings.Join(m, ", ")
		}
		fmt.Printf("%-4d %-11d %-12s %-14s %-9d %-9v %-8d %-9d %-8d %-14.2f %-9.1f %s\n", r.run, r.partitions,
			r.p50.Round(time.Millisecond), r.worst.Round(time.Millisecond), r.failures, r.fallback, r.refused, r.admitted,
			r.calls, r.cpu, r.memory, verdict)
	}
	return nil
}

// recordingClient is the coordinator's Redis client, recording when each partition was
// carried by a script call that succeeded. It runs in the coordinator's calls, so it keeps its
// work per partition to one map lookup: a record of its own must not be what slows the syncs
// it measures.
type recordingClient struct {
	*redis.Client
	mu       sync.Mutex       // protects the fields below
	index    map[string]int32 // a partition's renewals
	renewals []renewal
	from     time.Time
	calls    int
}

// renewal is when a partition was last renewed, and its longest wait between two renewals
// after from.
type renewal struct {
	last  time.Time
	worst time.Duration
}

func (r *recordingClient) record(args []any, cmd *redis.Cmd) *redis.Cmd {
	if cmd.Err() != nil || len(args) < 10 {
		return cmd
	}
	blob, ok := args[9].([]byte)
	if !ok {
		return cmd
	}
	n := len(blob) / 88 // the partitions' reports (internal/coord: reportBytes)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !now.Before(r.from) {
		r.calls++
	}
	for _, a := range args[10:min(len(args), 10+n)] {
		f, _ := a.(string)
		i, ok := r.index[f]
		if !ok {
			r.index[f] = int32(len(r.renewals))
			r.renewals = append(r.renewals, renewal{last: now})
			continue
		}
		p := &r.renewals[i]
		if !p.last.Before(r.from) {
			p.worst = max(p.worst, now.Sub(p.last))
		}
		p.last = now
	}
	return cmd
}

func (r *recordingClient) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return r.record(args, r.Client.EvalSha(ctx, sha, keys, args...))
}

func (r *recordingClient) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return r.record(args, r.Client.Eval(ctx, script, keys, args...))
}

// tenants runs the scenario once.
func (e *env) tenants(c config) (tenantResult, error) {
	var r tenantResult
	if err := resetRedis(e.redis.Addr); err != nil {
		return r, err
	}
	opt, err := redis.ParseURL(e.redis.URL)
	if err != nil {
		return r, err
	}
	// As a connector sets up its client for syncs: deadlines from the context, no retries
	// (a retry would outlive the call's deadline).
	opt.ContextTimeoutEnabled, opt.MaxRetries = true, -1
	start := time.Now()
	rc := &recordingClient{Client: redis.NewClient(opt), index: map[string]int32{},
		from: start.Add(tenantWarmup)}
	defer rc.Close()
	spec := coord.Spec{Name: "tenants", Rate: 1000, Burst: 1000, MaxConcurrent: 2}
	b := budget.New(budget.Spec{Rate: spec.Rate, Burst: spec.Burst, MaxConcurrent: spec.MaxConcurrent, MaxKeys: 2 * tenantCount})
	co, err := coord.New(coord.Options{Client: rc, Interval: c.interval, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return r, err
	}
	co.Register(spec, b)
	co.Start()
	defer co.Close(context.Background())

	keys := make([]string, tenantCount)
	for i := range keys {
		keys[i] = fmt.Sprintf("tenant-%d", i)
	}
	cpu0, err := redisCPU(rc.Client)
	if err != nil {
		return r, err
	}
	// A tenth of the tenants every tenth of a second: each tenant runs a statement (admitted
	// and released at once, a millisecond of execution) every second.
	const parts = 10
	tick := time.NewTicker(time.Second / parts)
	defer tick.Stop()
	end := start.Add(tenantRun)
	for i := 0; time.Now().Before(end); i++ {
		now := time.Now()
		counted := !now.Before(rc.from)
		for _, k := range keys[i%parts*tenantCount/parts : (i%parts+1)*tenantCount/parts] {
			req := []budget.Request{{Budget: b, Key: k, Cost: 0.001}}
			if _, d := budget.Admit(now, req, nil); d != nil {
				if counted {
					r.refused++
				}
				continue
			}
			budget.Release(now, &req[0], 0.001)
			if counted {
				r.admitted++
			}
		}
		<-tick.C
	}
	// The status walks every partition under the coordinator's lock: read once, at the end.
	// A sync that failed leaves its failure counted there and its partitions' renewals late.
	if st := co.Status(); len(st) > 0 {
		r.failures, r.fallback = st[0].Failures, st[0].Fallback
	}
	cpu1, err := redisCPU(rc.Client)
	if err != nil {
		return r, err
	}
	span := time.Since(rc.from).Seconds()
	r.cpu = (cpu1 - cpu0) / time.Since(start).Seconds()
	if info, err := rc.Info(context.Background(), "memory").Result(); err == nil {
		if i := strings.Index(info, "used_memory:"); i >= 0 {
			var used int64
			fmt.Sscanf(info[i:], "used_memory:%d", &used)
			r.memory = float64(used) / 1e6
		}
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	// A partition not renewed since waits until now.
	now := time.Now()
	waits := make([]time.Duration, 0, len(rc.renewals))
	for _, p := range rc.renewals {
		if !p.last.Before(rc.from) { // renewed after the warm-up
			waits = append(waits, max(p.worst, now.Sub(p.last)))
		}
	}
	r.calls = int(math.Round(float64(rc.calls) / span))
	r.partitions = len(waits)
	if len(waits) > 0 {
		slices.Sort(waits)
		r.p50, r.worst = waits[len(waits)/2], waits[len(waits)-1]
	}
	return r, nil
}

// redisCPU is the CPU time redis-server has used, in seconds (INFO cpu, user and system).
func redisCPU(rc *redis.Client) (float64, error) {
	info, err := rc.Info(context.Background(), "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), f); ok {
				var x float64
				if _, err := fmt.Sscanf(v, "%g", &x); err == nil {
					total += x
				}
			}
		}
	}
	return total, nil
}
