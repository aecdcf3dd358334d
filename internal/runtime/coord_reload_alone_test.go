package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// failingScripts fails the sync script's calls that its predicates pick, as a Redis that does
// not answer them would (the client gives up: an i/o timeout), without sending them.
type failingScripts struct {
	*redis.Client
	leaves atomic.Bool // fail the calls that leave a partition (a coordinator's goodbye)
	all    atomic.Bool // fail every call
	failed atomic.Int64
}

var errNoAnswer = errors.New("i/o timeout (the test's Redis does not answer)")

func (f *failingScripts) fails(args []any) bool {
	if f.all.Load() {
		return true
	}
	return f.leaves.Load() && leaves(args)
}

// leaves reports whether a sync script call's arguments leave a partition: a report's seventh
// number (sync.lua, ARGV[10]) is 1.
func leaves(args []any) bool {
	if len(args) < 10 {
		return false
	}
	var packed []byte
	switch v := args[9].(type) {
	case []byte:
		packed = v
	case string:
		packed = []byte(v)
	}
	for off := 0; off+88 <= len(packed); off += 88 {
		if math.Float64frombits(binary.LittleEndian.Uint64(packed[off+6*8:])) == 1 {
			return true
		}
	}
	return false
}

func (f *failingScripts) script(ctx context.Context, args []any, run func() *redis.Cmd) *redis.Cmd {
	if f.fails(args) {
		f.failed.Add(1)
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(errNoAnswer)
		return cmd
	}
	return run()
}

func (f *failingScripts) EvalSha(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	return f.script(ctx, args, func() *redis.Cmd { return f.Client.EvalSha(ctx, sha, keys, args...) })
}

func (f *failingScripts) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return f.script(ctx, args, func() *redis.Cmd { return f.Client.Eval(ctx, script, keys, args...) })
}

// TestCoordinationReloadKeepsALoneInstancesSlots: one instance shares a budget of 64 slots,
// and reloads change only its coordination section's sync_interval. Alone, it must refuse
// nothing that the budget process-local would admit, whatever Redis does at the reload:
//
//   - first its goodbye fails (Redis does not answer it) while its next sync is answered: Redis
//     must not count slots of this instance's past against it, so it is granted all 64;
//   - then every call fails across a reload: the leases in force stay in force, as they do
//     when any sync fails, rather than the provisional lease of an instance that never synced
//     (the budget over fallback_instances);
//
// and once Redis answers again it holds all 64 slots.
func TestCoordinationReloadKeepsALoneInstancesSlots(t *testing.T) {
	srv := redistest.Need(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	fc := &failingScripts{Client: rc}
	e := engine.New(engine.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now, After: time.After})
	r := New(e, Options{Redis: fc})
	t.Cleanup(func() { r.Close() })
	setInterval := func(interval string) {
		t.Helper()
		cfg, err := rules.Parse([]byte("coordination: {redis: \"" + srv.URL + "\", sync_interval: " + interval + "}\n" +
			"budgets:\n  - {name: a, mode: enforce, max_concurrent: 64}\n" +
			"rules:\n  - {budget: a, match: {statement: select}}\n"))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.SetConfig(cfg); err != nil {
			t.Fatal(err)
		}
	}
	status := func() coordStatus {
		st := r.Coordination()
		if len(st) != 1 {
			t.Fatalf("coordination %+v, want budget a", st)
		}
		return coordStatus{slots: st[0].Slots, syncs: st[0].Syncs, failures: st[0].Failures, instances: st[0].Instances}
	}
	waitFor := func(what string, ok func(coordStatus) bool) coordStatus {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if s := status(); ok(s) {
				return s
			}
			if time.Now().After(deadline) {
				t.Fatalf("not %s in 10s: %+v", what, status())
			}
		}
	}
	// refused begins n statements at once and reports how many were refused.
	refused := func(n int) int {
		var xs []*engine.Exec
		bad := 0
		for range n {
			x, err := begin(e, context.Background(), "select 1")
			if err != nil {
				bad++
				continue
			}
			xs = append(xs, x)
		}
		for _, x := range xs {
			x.Finish(context.Background(), nil)
		}
		return bad
	}

	setInterval("1s")
	waitFor("granted 64 slots", func(s coordStatus) bool { return s.syncs > 0 && s.slots == 64 })

	// The goodbye fails; the new coordinator's first sync is answered.
	fc.leaves.Store(true)
	setInterval("2s")
	s := waitFor("synced after the reload", func(s coordStatus) bool { return s.syncs > 0 })
	if s.slots != 64 || s.instances != 1 {
		t.Errorf("after a reload whose goodbye Redis did not answer, the lone instance holds %d slots and sees %d instances; want 64 and 1", s.slots, s.instances)
	}
	if n := refused(20); n > 0 {
		t.Errorf("after a reload whose goodbye Redis did not answer, %d of 20 statements refused (max_concurrent 64, alone)", n)
	}

	// Every call fails across the next reload.
	fc.all.Store(true)
	before := fc.failed.Load()
	setInterval("1s")
	for deadline := time.Now().Add(10 * time.Second); fc.failed.Load() == before || status().failures == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no failed sync in 10s after the reload: %+v", status())
		}
	}
	time.Sleep(50 * time.Millisecond) // the failed sync's leases handed over
	if n := refused(20); n > 0 {
		t.Errorf("after a reload whose first sync failed, %d of 20 statements refused (max_concurrent 64, alone): %+v", n, status())
	}

	synced := status().syncs
	fc.all.Store(false)
	fc.leaves.Store(false)
	s = waitFor("synced again", func(s coordStatus) bool { return s.syncs > synced })
	if s.slots != 64 {
		t.Errorf("once Redis answers again the lone instance holds %d slots, want 64: %+v", s.slots, s)
	}
	if n := refused(64); n > 0 {
		t.Errorf("once Redis answers again, %d of 64 statements refused (max_concurrent 64, alone)", n)
	}
	t.Logf("script calls failed: %d", fc.failed.Load())
}

type coordStatus struct {
	slots, instances int
	syncs, failures  uint64
}
