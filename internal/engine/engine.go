// Package engine is pgtraffic's decision path: for every statement it finds the pattern, merges
// the tags and matches the rule set (or reuses the route it cached for the same text and context
// tags, see route), predicts the cost when a budget needs it, and admits, warns about or blocks
// the statement. The driver package wraps it in database/sql interfaces.
//
// The engine holds no goroutine of its own on the hot path: buckets drain when read, the rule set
// is an immutable value swapped atomically on reload, and the only background work (the rules
// file watcher and the health sampler) runs off the hot path.
package engine

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/driver/rules"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Built-in tag keys (design.md §2 step 2).
const (
	KeyUsername        = "username"
	KeyDatabase        = "database"
	KeyApplicationName = "application_name"
	KeyFingerprint     = "fingerprint"
	KeyStatement       = "statement"
	KeyTable           = "table"
)

// Decisions, as reported to telemetry.
const (
	DecisionAllow = "allow"
	DecisionWarn  = "warn"
	DecisionBlock = "block"
)

// Options configure an Engine.
type Options struct {
	Logger           *slog.Logger
	Now              func() time.Time
	PatternCacheSize int
	MaxBuckets       int

	// Connection metadata, the built-in tags of every statement.
	User, Database, ApplicationName string

	// HealthConnect opens the health sampler's dedicated connection. Nil disables health metrics.
	HealthConnect func(ctx context.Context) (*pgx.Conn, error)

	// Observer, when set, sees every statement's decision and completion (telemetry).
	Observer Observer

	// OnStatement, when set, is called with every statement's merged tags (tests, debugging).
	OnStatement func(fingerprint string, tags []ruleset.KV)
}

// Engine decides, for each statement, whether it may run. It is safe for concurrent use.
type Engine struct {
	// What every statement reads fills the first cache line; the second holds the counters
	// every statement writes and what a statement under a budget reads next (TestEngineLayout).
	logH      slog.Handler // log's handler, asked directly whether debug logging is on
	obs       Observer
	state     atomic.Pointer[compiled]
	model     *cost.Model
	now       func() time.Time
	noSimple  bool // tests: every statement takes decide, the general path
	realClock bool // now is time.Now, so Finish reads the monotonic clock alone (time.Since)

	fastHits atomic.Uint64 // identity-cache hits (see pattern)
	// inFlight counts this engine's statements between Begin and Finish (the in_flight metric).
	inFlight atomic.Int64
	epoch    time.Time // the zero of clock
	stats    Stats     // ExplainCacheHits first

	log      *slog.Logger
	plans    *cost.PlanCache
	patterns *pattern.Cache
	// sampler reads server health for throttle_when; nil until a budget uses a sampled metric.
	// It is replaced (under mu) when health_interval changes; checks load it atomically.
	sampler       atomic.Pointer[health.Sampler]
	healthConnect func(ctx context.Context) (*pgx.Conn, error)
	healthEvery   time.Duration // the interval the current sampler was built with; under mu
	healthErrBase atomic.Uint64 // errors of samplers replaced since, so the counter never resets
	// healthSampleBase likewise for good reads.
	healthSampleBase atomic.Uint64
	builtins         []ruleset.KV
	onStmt           func(string, []ruleset.KV)
	maxKeys          int

	warns warnLimiter

	mu sync.Mutex // protects the fields below
	// budgets by name: kept across reloads so debt and in-flight counts survive.
	budgets map[string]*budget.Budget
	recent  []BlockRecord // ring of the most recent blocks
	next    int
	closed  bool
	watcher *watcher

	// fast is an identity cache in front of patterns (see pattern); a statement reads one slot.
	fast [fastSlots]atomic.Pointer[fastEntry]
}

// Stats are the engine's event counters; read them with the atomic Load methods.
type Stats struct {
	ExplainCacheHits, ExplainCalls, ExplainFailures, ExplainCacheMisses atomic.Uint64
	Reloads, ReloadFailures                                             atomic.Uint64
	Blocked, Warned                                                     atomic.Uint64
}

// New returns an engine with no rules: every statement is allowed.
func New(o Options) *Engine {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	realClock := o.Now == nil
	if realClock {
		o.Now = time.Now
	}
	if o.MaxBuckets <= 0 {
		o.MaxBuckets = 100_000
	}
	e := &Engine{
		log:       o.Logger,
		logH:      o.Logger.Handler(),
		now:       o.Now,
		realClock: realClock,
		epoch:     o.Now(),
		patterns:  pattern.NewCache(o.PatternCacheSize),
		model:     cost.NewModel(o.PatternCacheSize),
		plans:     cost.NewPlanCache(o.PatternCacheSize, 0),
		obs:       o.Observer,
		onStmt:    o.OnStatement,
		maxKeys:   o.MaxBuckets,
		budgets:   map[string]*budget.Budget{},
		recent:    make([]BlockRecord, 0, recentBlocks),
	}
	e.warns.init()
	for _, kv := range [...]ruleset.KV{
		{Key: KeyUsername, Value: o.User},
		{Key: KeyDatabase, Value: o.Database},
		{Key: KeyApplicationName, Value: o.ApplicationName},
	} {
		if kv.Value != "" {
			e.builtins = append(e.builtins, kv)
		}
	}
	e.healthConnect = o.HealthConnect
	e.state.Store(&compiled{empty: true})
	return e
}

// Close stops the rules-file watcher and the health sampler.
func (e *Engine) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	w := e.watcher
	e.watcher = nil
	e.mu.Unlock()
	var errs []error
	if w != nil {
		errs = append(errs, w.close())
	}
	if s := e.sampler.Load(); s != nil {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// PatternStats reports pattern lookups answered from cache (the identity cache in front of the
// pattern cache included), misses (each one pg_query parse) and the cached patterns.
func (e *Engine) PatternStats() (hits, misses uint64, size int) {
	hits, misses, size = e.patterns.Stats()
	return hits + e.fastHits.Load(), misses, size
}

// Patterns exposes the pattern cache (introspection and tests).
func (e *Engine) Patterns() *pattern.Cache { return e.patterns }

// Model exposes the cost model (introspection and tests).
func (e *Engine) Model() *cost.Model { return e.model }

// Stats returns the engine's counters.
func (e *Engine) Stats() *Stats { return &e.stats }

// InFlight reports the statements in flight through this engine.
func (e *Engine) InFlight() int64 { return e.inFlight.Load() }

// Denial describes a blocked statement; the driver turns it into a *driver.BlockedError.
type Denial struct {
	Budget, Rule, Reason, Fingerprint, Limit string
	RetryAfter                               time.Duration
}

func (d *Denial) Error() string {
	return fmt.Sprintf("pgtraffic: blocked by %q (%s, %s)", d.Budget, d.Reason, d.Limit)
}

// Exec is one statement between its admission and its completion. Finish must be called exactly
// once, by the single owner (the driver's Exec call or its Rows). Not safe for concurrent use.
type Exec struct {
	e       *Engine
	Pattern *pattern.Pattern
	// Tags are the statement's merged tags (built-in, comment, context; later wins).
	Tags      []ruleset.KV
	Decision  string   // allow, warn or block
	Reason    string   // the warn or block reason, "" when allowed cleanly
	Budgets   []string // names of the matching budgets that are not off
	Predicted float64  // predicted execution seconds; 0 when not predicted
	PlanCost  float64  // planner cost used; 0 when none
	Costed    bool     // a prediction was made (the model may train on this execution)
	Span      any      // the observer's per-statement state
	Observed  bool     // the observer records this statement's span (Wants had WantSpans at Begin)
	Wants     Wants    // what the observer recorded when the statement began (see Observer.Wants)
	// warm: the prediction came from a pattern past warmSamples executions, whose training
	// Finish samples (see train).
	warm bool
	// timed: Begin read the clock into at (rules were in force or telemetry recorded).
	timed bool
	// at is when the statement began, in nanoseconds since the engine's epoch (see mono); valid
	// when timed.
	at int64

	spare  *Spare           // the Spare that lent x; nil for an Exec of the pool
	slow   bool             // Begin spent time on an EXPLAIN or a wait: restart the clock
	holds  []budget.Request // admitted requests, released at Finish
	warned []budgetWarn

	// decide's scratch space (see decide). The fields above and reqBuf, which every statement
	// under a budget reads and writes, come first: together they span a few cache lines, while
	// the rest of the scratch space is touched only by routing afresh and by warnings.
	reqBuf    [8]budget.Request
	warnBuf   [2]budgetWarn
	rt        route // a route made afresh
	keyBuf    [8]string
	selBuf    [8]int
	ruleOfBuf [8]int
	reqIdxBuf [8]int
	admitWarn [8]budget.Warning
	tagBuf    [12]ruleset.KV
	ruleBuf   [8]int
	nameBuf   [4]string
}

var execPool = sync.Pool{New: func() any { return new(Exec) }}

// Spare is an Exec that its owner (a driver connection) lends to its statements in place of the
// engine's pool, which costs more than a flag per statement. While it is lent, a further
// statement of the same owner (database/sql allows one in a transaction whose rows are still
// open) takes an Exec from the pool. The zero value is ready to use.
type Spare struct {
	busy atomic.Bool // lent: set by Begin, cleared when the statement finishes (any goroutine)
	rng  uint64      // xorshift state of the training sample (see Exec.train); 0 until first used
	x    Exec        // after the flags, which then share a cache line with its first fields
}

// get returns an Exec for one statement: s's if it is free, else one from the pool.
func (s *Spare) get() *Exec {
	if s != nil && s.busy.CompareAndSwap(false, true) {
		s.x.spare = s
		return &s.x
	}
	return execPool.Get().(*Exec)
}

// Begin decides whether the statement may run. conn is the pgx stdlib connection it will run on
// (used for EXPLAIN; may be nil). It returns the Exec to Finish when the statement completes, or
// a *Denial error when it is blocked, or ctx's error when ctx ended while waiting for capacity.
// On a denial nothing has been taken from any budget.
func (e *Engine) Begin(ctx context.Context, conn *stdlib.Conn, query string, args []driver.NamedValue) (*Exec, error) {
	return e.BeginSpare(ctx, nil, conn, query, args)
}

// BeginSpare is Begin with the statement's Exec taken from spare when it is free (nil: always
// from the engine's pool).
func (e *Engine) BeginSpare(ctx context.Context, spare *Spare, conn *stdlib.Conn, query string, args []driver.NamedValue) (*Exec, error) {
	p, slot := e.pattern(query)
	x := spare.get()
	x.reset(e, p)
	st := e.state.Load()
	debug := e.logH.Enabled(ctx, slog.LevelDebug) // as log.Enabled, without the Logger's line
	// Tags are for rules, the statement hook, the debug log and span attributes: with none of
	// them (no rules in force, telemetry idle) the fast path skips merging them, and so does a
	// statement whose route (the rules' verdict on its text and context tags) is cached.
	if e.obs != nil {
		x.Wants = e.obs.Wants()
		x.Observed = x.Wants&WantSpans != 0
	}
	// A route of the text cached under st proves that rules are in force, without reading st
	// (a cache line less for the statements that have one).
	cached := slot.under(st)
	rules := cached != nil || !st.empty
	// The clock is for budgets, the cost model and telemetry: with no rules and telemetry idle,
	// nothing reads the statement's time, and it is not read (x.Start() is zero).
	if x.timed = rules || x.Wants != 0; x.timed {
		if e.realClock {
			x.at = int64(time.Since(e.epoch)) // mono, inlined (mono itself is too big to be)
		} else {
			x.at = e.mono()
		}
	}
	wantTags := x.Observed || e.onStmt != nil || debug
	var ctxTags tagging.Tags
	var rt *route
	if rules || wantTags {
		ctxTags = tagging.From(ctx)
	}
	// Guards read the tags, so a pattern with a guard fact has no cached route (see offer).
	if cached != nil && !p.UnsafeWrite && !p.Truncate && cached.tags.Equal(ctxTags) {
		rt = cached
	}
	if wantTags || (rules && rt == nil) {
		x.Tags = e.mergeTags(ctxTags, x.tagBuf[:0], p, query)
	}
	if e.onStmt != nil {
		e.onStmt(p.Fingerprint, x.Tags)
	}
	if debug {
		e.debugStatement(ctx, x)
	}
	if rules {
		handled, err := false, error(nil)
		if rt != nil && rt.simple && !e.noSimple {
			handled, err = e.decideSimple(ctx, st, x, rt, slot)
		}
		if !handled {
			err = e.decide(ctx, st, x, rt, slot, ctxTags, conn, query, args)
		}
		if err != nil {
			if e.obs != nil {
				e.obs.Blocked(ctx, x, err)
			}
			x.release()
			return nil, err
		}
	}
	e.inFlight.Add(1)
	if x.Observed {
		e.obs.Started(ctx, x)
	}
	// Measure the statement from here: an EXPLAIN or a wait for capacity is not its cost.
	if x.slow {
		x.at = e.mono()
	}
	return x, nil
}

// clock converts t to nanoseconds since the engine's epoch, the time of the engine's hot path
// (see mono). With the real clock both have a monotonic reading, so a wall-clock step does not
// move it.
func (e *Engine) clock(t time.Time) int64 { return int64(t.Sub(e.epoch)) }

// mono is the engine's clock now: nanoseconds since its epoch. A statement keeps its start so
// (Exec.at), and budgets are made with the same epoch (budget.NewAt), so admission and release
// take it as it is. With the real clock this reads only the monotonic clock (time.Since),
// where time.Now would read the wall clock too.
func (e *Engine) mono() int64 {
	if e.realClock {
		return int64(time.Since(e.epoch))
	}
	return e.clock(e.now())
}

// Start returns when the statement began (when its admission was decided: the engine restarts
// it after an EXPLAIN or a wait for capacity). It is the zero Time when nothing read the clock
// at Begin: no rules were in force and telemetry was idle.
//
// It reads the clock: the start is now less the monotonic time elapsed since, rather than the
// engine's epoch plus the statement's offset, whose wall reading would lag by every step of the
// wall clock since the epoch (NTP, a resumed VM), and a span started there would seem to last
// that much longer. Not for the hot path.
func (x *Exec) Start() time.Time {
	if !x.timed {
		return time.Time{}
	}
	now := x.e.now()
	return now.Add(-time.Duration(x.e.clock(now) - x.at))
}

// Finish releases the statement's holds, trues its debt up to the actual time and trains the
// cost model. err is the statement's error (nil on success); a cancelled or failed statement does
// not train the model.
func (x *Exec) Finish(ctx context.Context, err error) {
	e := x.e
	if !x.timed {
		// No rules were in force and telemetry was idle at Begin: no holds, no training,
		// no observer call; only the in-flight count to give back.
		e.inFlight.Add(-1)
		x.release()
		return
	}
	var took time.Duration
	if e.realClock {
		took = time.Since(e.epoch) - time.Duration(x.at) // mono, inlined as in Begin
	} else {
		took = time.Duration(e.mono() - x.at)
	}
	actual := took.Seconds()
	if len(x.holds) > 0 {
		if !x.slow {
			// The holds were admitted at x.at: each is released took after its admission.
			for i := range x.holds {
				budget.ReleaseAfter(&x.holds[i], took, actual)
			}
		} else {
			// Admitted before an EXPLAIN or a wait restarted x.at.
			now := x.Start().Add(took)
			for i := range x.holds {
				budget.Release(now, &x.holds[i], actual)
			}
		}
	}
	e.inFlight.Add(-1)
	if err == nil && x.Costed && x.train(took) && ctx.Err() == nil {
		e.model.Observe(x.Pattern.FingerprintID, x.PlanCost, actual)
	}
	if x.Wants&(WantSpans|WantDuration) != 0 {
		e.obs.Finished(ctx, x, err, took)
	}
	x.release()
}

// Training the cost model on a statement (cost.Model.Observe: its lock, a table lookup and a
// dozen averages) costs more than the rest of the statement's decision. A pattern's averages
// weigh the last ten or so samples, so a pattern that runs thousands of times a second gains
// nothing from each one. After warmSamples executions a pattern therefore trains on a random
// one in trainEvery of its cheap statements, and on every statement that took trainAlways or
// longer: those are the ones budgets exist for, and their training is a millionth of their
// time. Sampling at random, rather than every n-th statement, cannot lock onto a workload that
// repeats with the same period; it leaves the averages unbiased and only makes them span more
// executions (about trainEvery × 10 for a cheap pattern: at 10,000 a second, 16 ms).
//
// A training costs ~650 instructions with the text's forecast made again after it, mostly cache
// misses on the model's state: at one in eight cheap statements it was 5% of the budget path.
const (
	trainEvery  = 16
	trainAlways = time.Millisecond
)

// train reports whether the model trains on x's execution, which took took.
func (x *Exec) train(took time.Duration) bool {
	if !x.warm || took >= trainAlways {
		return true
	}
	sp := x.spare
	if sp == nil {
		return true // an Exec of the pool: rare, and it has no generator of its own
	}
	// xorshift64 (Marsaglia): the Spare belongs to one connection, so its state needs no lock.
	r := sp.rng
	if r == 0 {
		r = uint64(uintptr(unsafe.Pointer(sp))) | 1
	}
	r ^= r << 13
	r ^= r >> 7
	r ^= r << 17
	sp.rng = r
	return r%trainEvery == 0
}

// fastSlots is the size of the engine's identity cache in front of the pattern cache, and
// fastMaxLen the longest statement text it keeps (so it pins at most 512 KiB).
const (
	fastSlots  = 256
	fastMaxLen = 2048
)

// fastEntry remembers the pattern of one query string value.
type fastEntry struct {
	query  string
	p      *pattern.Pattern
	routes routeSlot // the text's last route (see route)
	// 96 bytes (TestFastEntrySize): objects of that size class start 0 or 32 bytes into a cache
	// line, so an entry spans two lines; at 104 to 112 bytes some would straddle three.
}

// pattern returns the statement's pattern. Applications send the same few string values (the
// constants in their code) again and again, so a direct-mapped table keyed by the string's data
// pointer and length answers most lookups with one atomic load and two compares, before the
// pattern cache hashes and scans the text. The entry keeps its string alive, so an equal pointer
// and length is the same immutable text.
//
// It also returns the text's route slot, nil for a text the table does not keep.
func (e *Engine) pattern(query string) (*pattern.Pattern, *routeSlot) {
	ptr := uintptr(unsafe.Pointer(unsafe.StringData(query)))
	slot := &e.fast[(ptr>>4^uintptr(len(query)))%fastSlots]
	if f := slot.Load(); f != nil && len(f.query) == len(query) && unsafe.StringData(f.query) == unsafe.StringData(query) {
		e.fastHits.Add(1)
		return f.p, &f.routes
	}
	p, _ := e.patterns.Get(query)
	// Only short texts: an entry pins its string, and 256 pinned megabyte-long statements
	// would be a quarter of a gigabyte.
	if len(query) > 0 && len(query) <= fastMaxLen {
		f := &fastEntry{query: query, p: p}
		slot.Store(f)
		return p, &f.routes
	}
	return p, nil
}

// reset readies a pooled Exec. It sets each header field rather than assigning a zero Exec, so
// the inline buffers (most of its size) are not cleared on every statement; they are always
// written before they are read.
func (x *Exec) reset(e *Engine, p *pattern.Pattern) {
	x.e, x.Pattern, x.at = e, p, 0
	x.Tags, x.Budgets, x.holds, x.warned = nil, nil, nil, nil
	x.Decision, x.Reason = DecisionAllow, ""
	x.Predicted, x.PlanCost, x.Costed, x.slow, x.Observed, x.warm = 0, 0, false, false, false, false
	x.Span, x.Wants, x.timed = nil, 0, false
}

func (x *Exec) release() {
	if sp := x.spare; sp != nil {
		// A Spare's Exec stays with its connection, and reset rewrites every field that the
		// next statement reads, so it keeps its references (pattern, budgets, keys: small, and
		// what the connection's next statement likely uses again) until then. Only the span,
		// which may be large, is dropped.
		x.Span = nil
		sp.busy.Store(false) // after every write to x: the next Begin's CompareAndSwap sees them
		return
	}
	// Drop references so a pooled Exec pins no pattern, span or budget.
	x.e, x.Pattern, x.Span = nil, nil, nil
	// Drop budget pointers and keys of the requests and holds (in reqBuf unless there were more
	// than it holds). A loop, not clear: for the usual one request it is a few stores rather than
	// a call into the runtime.
	for i := range x.reqBuf[:min(max(len(x.Budgets), len(x.holds)), len(x.reqBuf))] {
		x.reqBuf[i] = budget.Request{}
	}
	// A route made in x's scratch space: drop its rules, tags and keys.
	if x.rt.st != nil {
		clear(x.keyBuf[:min(len(x.rt.keys), len(x.keyBuf))])
		x.rt = route{}
	}
	x.Tags, x.Budgets, x.holds, x.warned = nil, nil, nil, nil
	execPool.Put(x)
}

// mergeTags builds the statement's tags: built-in metadata, then sqlcommenter tags from the
// statement's comment, then ctxTags (the context's tags); a later source replaces every pair of an earlier
// source with the same key.
func (e *Engine) mergeTags(ctxTags tagging.Tags, dst []ruleset.KV, p *pattern.Pattern, query string) []ruleset.KV {
	var comment tagging.Tags
	if strings.Contains(query, "/*") {
		comment = tagging.Parse(query)
	}
	if ctxTags.Len() == 0 && comment.Len() == 0 {
		// The common case: built-ins only, nothing can shadow them.
		dst = append(dst, e.builtins...)
		dst = append(dst, ruleset.KV{Key: KeyFingerprint, Value: p.Fingerprint}, ruleset.KV{Key: KeyStatement, Value: p.Kind})
		for _, t := range p.Tables {
			dst = append(dst, ruleset.KV{Key: KeyTable, Value: t})
		}
		return dst
	}
	// Which built-in keys a comment or context tag replaces, as bits (no lookups per key).
	var shadow uint8
	for k := range comment.All() {
		shadow |= builtinBit(k)
	}
	for k := range ctxTags.All() {
		shadow |= builtinBit(k)
	}
	for _, kv := range e.builtins {
		if shadow&builtinBit(kv.Key) == 0 {
			dst = append(dst, kv)
		}
	}
	if shadow&bitFingerprint == 0 {
		dst = append(dst, ruleset.KV{Key: KeyFingerprint, Value: p.Fingerprint})
	}
	if shadow&bitStatement == 0 {
		dst = append(dst, ruleset.KV{Key: KeyStatement, Value: p.Kind})
	}
	if shadow&bitTable == 0 {
		for _, t := range p.Tables {
			dst = append(dst, ruleset.KV{Key: KeyTable, Value: t})
		}
	}
	if comment.Len() > 0 {
		for k, v := range comment.All() {
			if _, ok := ctxTags.Get(k); !ok {
				dst = append(dst, ruleset.KV{Key: k, Value: v})
			}
		}
	}
	for k, v := range ctxTags.All() {
		dst = append(dst, ruleset.KV{Key: k, Value: v})
	}
	return dst
}

// debugStatement logs a statement's pattern and merged tags at debug level. Tags are metadata
// chosen by the application; the statement text is logged normalised, never raw.
func (e *Engine) debugStatement(ctx context.Context, x *Exec) {
	attrs := make([]any, 0, len(x.Tags)+3)
	attrs = append(attrs, slog.String("fingerprint", x.Pattern.Fingerprint), slog.String("query", x.Pattern.Normalized))
	tags := make([]any, 0, len(x.Tags))
	for _, kv := range x.Tags {
		tags = append(tags, slog.String(kv.Key, kv.Value))
	}
	attrs = append(attrs, slog.Group("tags", tags...))
	e.log.DebugContext(ctx, "pgtraffic: statement", attrs...)
}

const (
	bitUsername uint8 = 1 << iota
	bitDatabase
	bitApplicationName
	bitFingerprint
	bitStatement
	bitTable
)

// builtinBit is the bit of a built-in tag key, 0 for other keys.
func builtinBit(k string) uint8 {
	switch k {
	case KeyUsername:
		return bitUsername
	case KeyDatabase:
		return bitDatabase
	case KeyApplicationName:
		return bitApplicationName
	case KeyFingerprint:
		return bitFingerprint
	case KeyStatement:
		return bitStatement
	case KeyTable:
		return bitTable
	}
	return 0
}

// tagValue returns the first value of key in tags.
func tagValue(tags []ruleset.KV, key string) (string, bool) {
	for _, kv := range tags {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return "", false
}

// BlockRecord is one recent block, for introspection.
type BlockRecord struct {
	At          time.Time `json:"at"`
	Budget      string    `json:"budget"`
	Reason      string    `json:"reason"`
	Fingerprint string    `json:"fingerprint"`
	Query       string    `json:"query"` // normalised text
}

const recentBlocks = 32

func (e *Engine) recordBlock(now time.Time, d *Denial, p *pattern.Pattern) {
	e.stats.Blocked.Add(1)
	r := BlockRecord{At: now, Budget: d.Budget, Reason: d.Reason, Fingerprint: d.Fingerprint, Query: p.Normalized}
	e.mu.Lock()
	if len(e.recent) < recentBlocks {
		e.recent = append(e.recent, r)
	} else {
		e.recent[e.next] = r
	}
	e.next = (e.next + 1) % recentBlocks
	e.mu.Unlock()
}

// RecentBlocks returns the most recent blocks, newest first.
func (e *Engine) RecentBlocks() []BlockRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := append([]BlockRecord(nil), e.recent...)
	sort.Slice(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	return out
}

// Observer sees statements for telemetry. Its methods are called on the statement's goroutine
// and must not block.
type Observer interface {
	// Wants reports what the observer records now. The engine asks once per statement, keeps
	// the answer in Exec.Wants, and skips the calls for the rest: Started runs only with
	// WantSpans (and only then does the engine merge tags for it), Finished with WantSpans or
	// WantDuration, Decision with WantDecisions. Blocked always runs.
	Wants() Wants
	Started(ctx context.Context, x *Exec)
	Blocked(ctx context.Context, x *Exec, err error)
	Finished(ctx context.Context, x *Exec, err error, d time.Duration)
	Decision(budget, decision, reason string)
}

// Wants are the kinds of telemetry an Observer records; see Observer.Wants.
type Wants uint8

const (
	WantSpans     Wants = 1 << iota // a span per statement, with its tags
	WantDuration                    // the duration metric
	WantDecisions                   // the per-budget decision counter
)

// config type re-exported for the driver's convenience.
type Config = rules.Config
