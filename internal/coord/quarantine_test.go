package coord

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// fakeQuarantines records what a coordinator hands over, by budget and fingerprint.
type fakeQuarantines struct {
	mu   sync.Mutex // protects got
	got  map[string]map[uint64]time.Time
	spec QuarantineSpec // the settings of the last hand-over
}

func (f *fakeQuarantines) AddQuarantines(_ time.Time, spec Spec, qs []Quarantined) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.got == nil {
		f.got = map[string]map[uint64]time.Time{}
	}
	m := f.got[spec.Name]
	if m == nil {
		m = map[uint64]time.Time{}
		f.got[spec.Name] = m
	}
	for _, q := range qs {
		m[q.Fingerprint] = q.Until
	}
	f.spec = spec.Quarantine
}

func (f *fakeQuarantines) of(budget string) map[uint64]time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint64]time.Time{}
	for k, v := range f.got[budget] {
		out[k] = v
	}
	return out
}

// quarantineInstance is a coordinator on a stopped clock whose sink is recorded.
func quarantineInstance(t *testing.T, rc redis.UniversalClient, id string, now time.Time) (*Coordinator, *fakeQuarantines) {
	t.Helper()
	q := &fakeQuarantines{}
	c := newCoord(t, Options{Client: rc, Interval: time.Second, Instance: id, Logger: quiet, Quarantines: q,
		Now: func() time.Time { return now }})
	return c, q
}

var thirty = QuarantineSpec{After: 2, For: 30 * time.Second}

// redisNow is Redis's clock in µs.
func redisNow(t *testing.T, rc *redis.Client) int64 {
	t.Helper()
	tm, err := rc.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return tm.UnixMicro()
}

// A quarantine one instance publishes reaches the other at its next sync, with its time
// left: a budget with nothing to lease (no local budget) syncs for it alone, even with no
// partition. Redis holds one field per fingerprint under the settings' key, expiring with it.
func TestQuarantinePublishedAndRead(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	now := time.Unix(1_000_000, 0)
	a, qa := quarantineInstance(t, rc, "a", now)
	b, qb := quarantineInstance(t, rc, "b", now)
	spec := Spec{Name: "q", Quarantine: thirty}
	ha := a.Register(spec, nil)
	b.Register(spec, nil)
	const fp = 0x0123456789abcdef

	mustSync(t, b) // B has read nothing yet
	if got := qb.of("q"); len(got) != 0 {
		t.Fatalf("B read %v before any quarantine", got)
	}
	ha.Quarantine(fp, now.Add(30*time.Second))
	mustSync(t, a)
	key := QuarantineKey("", "q", thirty)
	if key != "pgtraffic:{q}:q:2:30s" {
		t.Fatalf("key %q", key)
	}
	end, err := rc.HGet(context.Background(), key, vocab.FingerprintHex(fp)).Float64()
	if err != nil {
		t.Fatal(err)
	}
	if left := int64(end) - redisNow(t, rc); left <= 29e6 || left > 30e6 {
		t.Fatalf("Redis holds %v left, want about 30s", time.Duration(left)*time.Microsecond)
	}
	if ttl, err := rc.PTTL(context.Background(), key).Result(); err != nil || ttl <= 29*time.Second || ttl > 30*time.Second+time.Millisecond {
		t.Fatalf("the hash expires in %v (%v), want with its quarantine", ttl, err)
	}
	mustSync(t, b)
	for name, q := range map[string]*fakeQuarantines{"A (its own)": qa, "B": qb} {
		until, ok := q.of("q")[fp]
		if !ok || until.After(now.Add(30*time.Second)) || until.Before(now.Add(29*time.Second)) {
			t.Errorf("%s read %v, want %x until about now + 30s", name, q.of("q"), uint64(fp))
		}
		if q.spec != thirty {
			t.Errorf("%s was handed settings %+v", name, q.spec)
		}
	}
	if s := b.Status(); len(s) != 1 || s[0].Syncs != 2 || s[0].Partitions != 0 || s[0].Ignored != 0 {
		t.Errorf("B's status %+v, want two syncs of a budget without partitions", s)
	}

	// Other settings are another hash: they do not see these quarantines.
	c, qc := quarantineInstance(t, rc, "c", now)
	c.Register(Spec{Name: "q", Quarantine: QuarantineSpec{After: 3, For: 30 * time.Second}}, nil)
	mustSync(t, c)
	if got := qc.of("q"); len(got) != 0 {
		t.Errorf("an instance on other settings read %v", got)
	}
}

// Everything read back from Redis is checked: fields that are not fingerprints, ends that are
// not numbers or have passed are dropped from the hash; an end past for: from now (a Redis
// whose clock went back) is cut to it; the hash never holds more than MaxQuarantines.
func TestQuarantineHashValidatedAndPruned(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	a, qa := quarantineInstance(t, rc, "a", now)
	ha := a.Register(Spec{Name: "v", Quarantine: thirty}, nil)
	key := QuarantineKey("", "v", thirty)
	rn := redisNow(t, rc)
	us := func(d time.Duration) string { return strconv.FormatInt(rn+d.Microseconds(), 10) }
	good := vocab.FingerprintHex(1)
	far := vocab.FingerprintHex(2)
	if err := rc.HSet(ctx, key,
		good, us(10*time.Second),
		far, us(time.Hour),
		vocab.FingerprintHex(3), us(-time.Second), // ended
		vocab.FingerprintHex(4), "nan",
		vocab.FingerprintHex(5), "inf",
		vocab.FingerprintHex(6), "x",
		"0123456789ABCDEF", us(10*time.Second), // not lower case
		"12345", us(10*time.Second),
		"i:someone", us(10*time.Second),
	).Err(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	fields, err := rc.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(fields) != 2 || fields[good] == "" || fields[far] == "" {
		t.Fatalf("the hash holds %v, want only the two valid quarantines", fields)
	}
	if end, _ := strconv.ParseFloat(fields[far], 64); int64(end) > redisNow(t, rc)+thirty.For.Microseconds() {
		t.Errorf("an end an hour ahead was kept: %s", fields[far])
	}
	got := qa.of("v")
	if len(got) != 2 || got[1].After(now.Add(10*time.Second)) || got[1].Before(now.Add(9*time.Second)) ||
		got[2].After(now.Add(30*time.Second)) || got[2].Before(now.Add(29*time.Second)) {
		t.Fatalf("handed over %v, want 1 for about 10s and 2 for at most 30s", got)
	}

	// Full: a new fingerprint is not added, one already there is extended.
	args := make([]any, 0, 2*MaxQuarantines)
	for i := range MaxQuarantines {
		args = append(args, vocab.FingerprintHex(uint64(1000+i)), us(10*time.Second))
	}
	if err := rc.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rc.HSet(ctx, key, args...).Err(); err != nil {
		t.Fatal(err)
	}
	ha.Quarantine(7, now.Add(20*time.Second))
	ha.Quarantine(1000, now.Add(20*time.Second))
	mustSync(t, a)
	if n, _ := rc.HLen(ctx, key).Result(); n != MaxQuarantines {
		t.Errorf("the hash holds %d fields, want at most %d", n, MaxQuarantines)
	}
	if ok, _ := rc.HExists(ctx, key, vocab.FingerprintHex(7)).Result(); ok {
		t.Error("a full hash took a new fingerprint")
	}
	if end, _ := rc.HGet(ctx, key, vocab.FingerprintHex(1000)).Float64(); int64(end)-redisNow(t, rc) < 19e6 {
		t.Errorf("an existing fingerprint was not extended: %v left", time.Duration(int64(end)-redisNow(t, rc))*time.Microsecond)
	}

	// A key of another type (another writer) is replaced, not a failing sync.
	if err := rc.Set(ctx, key, "junk", 0).Err(); err != nil {
		t.Fatal(err)
	}
	ha.Quarantine(8, now.Add(20*time.Second))
	mustSync(t, a)
	if ok, err := rc.HExists(ctx, key, vocab.FingerprintHex(8)).Result(); err != nil || !ok {
		t.Errorf("after a key of another type: %v, %v", ok, err)
	}
}

// What the script returns is checked again in Go: a bad fingerprint, a time left that is not
// positive, an odd entry or one past MaxQuarantines is ignored and counted; a time left past
// for: is cut to it.
func TestDecodeQuarantines(t *testing.T) {
	q := QuarantineSpec{After: 1, For: 10 * time.Second}
	got, ignored := decodeQuarantines([]any{
		vocab.FingerprintHex(1), int64(5e6),
		vocab.FingerprintHex(2), int64(3600e6), // cut to for:
		vocab.FingerprintHex(3), int64(0),
		vocab.FingerprintHex(4), int64(-5),
		vocab.FingerprintHex(5), "nan",
		"zz", int64(5e6),
		int64(6), int64(5e6),
		"0123456789ABCDEF", int64(5e6),
		vocab.FingerprintHex(9),
	}, q)
	want := []leftFor{{1, 5 * time.Second}, {2, 10 * time.Second}}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] || ignored != 7 {
		t.Fatalf("decoded %v, ignored %d; want %v and 7", got, ignored, want)
	}
	if _, ignored := decodeQuarantines("junk", q); ignored != 1 {
		t.Errorf("a reply that is no list: ignored %d", ignored)
	}
	long := make([]any, 0, 2*MaxQuarantines+20)
	for i := range MaxQuarantines + 10 {
		long = append(long, vocab.FingerprintHex(uint64(i)), int64(1e6))
	}
	if got, ignored := decodeQuarantines(long, q); len(got) != MaxQuarantines || ignored != 10 {
		t.Errorf("a reply of %d: took %d, ignored %d", MaxQuarantines+10, len(got), ignored)
	}
	if _, err := decodeReply([]any{"1", int64(0), []any{}}, 1, &q); err == nil {
		t.Error("a reply missing a partition's result was accepted")
	}
}

// Redis down: the quarantine waits on the instance and is published once Redis is back. A
// reload that changes the settings drops what waits.
func TestQuarantineWaitsForRedis(t *testing.T) {
	srv := redistest.Need(t)
	rc := newClient(t, srv)
	ctx := context.Background()
	now := time.Unix(1_000_000, 0)
	a, _ := quarantineInstance(t, rc, "a", now)
	spec := Spec{Name: "w", Quarantine: thirty}
	ha := a.Register(spec, nil)
	mustSync(t, a)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	ha.Quarantine(1, now.Add(30*time.Second))
	if err := a.Sync(ctx); err == nil {
		t.Fatal("a sync with Redis down succeeded")
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	mustSync(t, a)
	if ok, err := rc.HExists(ctx, QuarantineKey("", "w", thirty), vocab.FingerprintHex(1)).Result(); err != nil || !ok {
		t.Fatalf("the quarantine made while Redis was down was not published: %v, %v", ok, err)
	}

	ha.Quarantine(2, now.Add(30*time.Second))
	other := QuarantineSpec{After: 5, For: 30 * time.Second}
	ha.SetSpec(Spec{Name: "w", Quarantine: other})
	mustSync(t, a)
	for _, k := range []string{QuarantineKey("", "w", thirty), QuarantineKey("", "w", other)} {
		if ok, err := rc.HExists(ctx, k, vocab.FingerprintHex(2)).Result(); err != nil || ok {
			t.Errorf("a quarantine made under the old settings was published to %s: %v, %v", k, ok, err)
		}
	}
}

// A new quarantine asks for an early sync, as a new partition does; a budget without
// shared quarantines takes none.
func TestQuarantineSyncsEarly(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	c := newCore(Spec{Name: "e", Quarantine: thirty}, time.Second, 1, func() float64 { return 0.5 })
	if chunks := c.reports(t0); len(chunks) != 1 || len(chunks[0]) != 0 {
		t.Fatalf("a budget with quarantines and no partition reports %v, want one empty chunk", chunks)
	}
	c.applied(t0, t0, nil, nil)
	if !c.quarantined(Quarantined{1, t0.Add(time.Minute)}) {
		t.Fatal("quarantined refused")
	}
	if c.due(t0.Add(newGap(c.interval)-time.Millisecond), true) {
		t.Error("due before the early gap")
	}
	if !c.due(t0.Add(newGap(c.interval)), false) {
		t.Error("not due early for a quarantine to publish")
	}
	if got := c.takePublish(t0.Add(2 * time.Minute)); len(got) != 0 {
		t.Errorf("published a quarantine that ended: %v", got)
	}
	local := newCore(Spec{Name: "l", MaxConcurrent: 1}, time.Second, 1, func() float64 { return 0.5 })
	if local.quarantined(Quarantined{1, t0.Add(time.Minute)}) || len(local.reports(t0)) != 0 {
		t.Error("a budget without shared quarantines took one, or syncs with no partition")
	}
}

// TestQuarantineShorterThanAMicrosecond: a quarantine's for: below Redis's microsecond
// (for: 500ns, which the rules accept) is sent as one microsecond; sent as zero, the script
// skipped the quarantines and every sync failed on its short answer, leaving the budget on
// its fallback share.
func TestQuarantineShorterThanAMicrosecond(t *testing.T) {
	rc := newClient(t, redistest.Need(t))
	now := time.Unix(1_000_000, 0)
	a, _ := quarantineInstance(t, rc, "a", now)
	h := a.Register(Spec{Name: "tiny", MaxConcurrent: 8, Quarantine: QuarantineSpec{After: 1, For: 500 * time.Nanosecond}}, nil)
	h.Quarantine(0x0123456789abcdef, now.Add(500*time.Nanosecond))
	for range 2 {
		mustSync(t, a)
	}
	if s := a.Status(); len(s) != 1 || s[0].Syncs != 2 || s[0].Failures != 0 {
		t.Errorf("status %+v, want two syncs and no failure", s)
	}
}
