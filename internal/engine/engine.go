package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/loglimit"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
	"github.com/pgtraffic/pgtraffic/tagging"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// Decisions, as reported to telemetry.
const (
	DecisionAllow = "allow"
	DecisionWarn  = "warn"
	DecisionBlock = "block"
)

// Options configure an Engine.
type Options struct {
	Logger *slog.Logger
	// Now and After are the engine's clock: the time, and a channel that receives after d (for
	// max_wait and Wait). Nil means time.Now and time.After; tests inject a fake clock.
	Now              func() time.Time
	After            func(d time.Duration) <-chan time.Time
	PatternCacheSize int // bounds every cache of texts, patterns and costs; <= 0 is pattern.DefaultMaxEntries
	MaxBuckets       int // per-key states kept per budget; <= 0 is budget.DefaultMaxKeys

	// Connection metadata, the built-in tags of every statement.
	User, Database, ApplicationName string

	// Observer, when set, sees every statement's decision and completion (telemetry).
	Observer Observer
}

// Engine decides, for each statement, whether it may run. It is safe for concurrent use.
//
// What a statement reads is immutable, atomic or behind a lock of its own that is held only for
// a few steps. What changes it (a reload, the health sampler, the coordinator) runs beside the
// statements, in the package that owns their lifecycles, through Compile and Install,
// SetHealth and the quarantine exchange (quarantine.go).
type Engine struct {
	log      *slog.Logger
	obs      Observer
	now      func() time.Time
	after    func(time.Duration) <-chan time.Time
	state    atomic.Pointer[compiled] // the rules in force, immutable; swapped by SetConfig
	model    *cost.Model
	patterns *pattern.Cache
	texts    *textCache
	builtins []ruleset.KV
	maxKeys  int
	stats    Stats
	// inFlight counts this engine's statements from Begin (a statement begun before its
	// connection: from Acquired) to Finish or Abandon, the in_flight metric: a pool statement
	// waiting for a connection runs nothing on the server.
	inFlight atomic.Int64
	// pending counts the statements admitted before their connection (BeginBeforeConn; a
	// batch's statements each) from their admission to Acquired or Abandon. An in_flight
	// threshold holds such a statement to the running statements and these, as a budget's slot
	// does (healthDenial): counted only once running, the pool's statements admitted while
	// others waited for connections would all run at once.
	pending atomic.Int64
	ends    ends // tells the claims waiting under an in_flight threshold that statements ended
	// explains are the patterns whose plan-caching EXPLAIN is on its way (explaining.go).
	explains explaining
	// floor is the network's round trip in nanoseconds, taken off the client's measurement of
	// each statement (SetNetworkFloor); 0: none known.
	floor atomic.Int64
	// clientCharges are the charges on the client's clock that the server's reports true up
	// (serverclock.go).
	clientCharges clientCharges
	warns         loglimit.Limiter // decision logs, per budget and decision
	blocks        blockLog         // the most recent blocks, for the status (blocks.go)
	// quarantined holds the patterns' overruns and quarantines (quarantine.go).
	quarantined quarantines
	// health is the health sampler for throttle_when; nil until a budget uses a sampled metric
	// (SetHealth). Statements load it.
	health atomic.Pointer[health.Sampler]
	gens   atomic.Uint64 // numbers the Compiles (Rules.Gen)
	reg    registry      // the budgets by name, across reloads (compile.go)
	// closed is set by Close (once: closeOnce), and done is closed then: the front ends, and a
	// statement woken in a budget's queue, read closed (Closed, once per statement); a job
	// in Wait selects on done. Either leaves with ErrClosed (admission.go, check.go).
	closed    atomic.Bool
	done      chan struct{}
	closeOnce sync.Once
}

// Stats are the engine's event counters; read them with the atomic Load methods.
type Stats struct {
	ExplainCacheHits, ExplainCalls, ExplainFailures, ExplainCacheMisses atomic.Uint64
	Reloads, ReloadFailures                                             atomic.Uint64
	Blocked, Warned                                                     atomic.Uint64
	// Probes counts the statements run as a probe of a pattern refused as too costly
	// (admission.go), once admitted (decide).
	Probes atomic.Uint64
}

// New returns an engine with no rules: every statement is allowed.
func New(o Options) *Engine {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.After == nil {
		o.After = time.After
	}
	// One size for every cache of patterns: the text cache in front of the pattern cache, and
	// the cost model's table of patterns behind it.
	size := o.PatternCacheSize
	if size <= 0 {
		size = pattern.DefaultMaxEntries
	}
	e := &Engine{
		log:      o.Logger,
		now:      o.Now,
		after:    o.After,
		patterns: pattern.NewCache(size),
		texts:    newTextCache(size),
		model:    cost.NewModel(size),
		obs:      o.Observer,
		maxKeys:  o.MaxBuckets,
		done:     make(chan struct{}),
	}
	for _, kv := range [...]ruleset.KV{
		{Key: vocab.KeyUsername, Value: o.User},
		{Key: vocab.KeyDatabase, Value: o.Database},
		{Key: vocab.KeyApplicationName, Value: o.ApplicationName},
	} {
		if kv.Value != "" {
			e.builtins = append(e.builtins, kv)
		}
	}
	e.state.Store(&compiled{empty: true})
	return e
}

// Clock is e's clock (Options.Now and Options.After), for what runs beside the statements.
func (e *Engine) Clock() (now func() time.Time, after func(time.Duration) <-chan time.Time) {
	return e.now, e.after
}

// Logger is e's logger (Options.Logger).
func (e *Engine) Logger() *slog.Logger { return e.log }

// SetHealth makes s the health sampler that throttle_when reads from the next statement on;
// nil: none (only in_flight, a local count, is evaluated).
func (e *Engine) SetHealth(s *health.Sampler) { e.health.Store(s) }

// PatternStats reports pattern lookups answered from cache (the text cache in front of the
// pattern cache included), misses (each one pg_query parse) and the cached patterns.
func (e *Engine) PatternStats() (hits, misses uint64, size int) {
	hits, misses, size = e.patterns.Stats()
	return hits + e.texts.hits.Load(), misses, size
}

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

// Exec is one statement's ticket, from Begin to Finish. It has two parts: its [Result], what the
// engine decided, which the front end and the observer read; and the engine's private scratch,
// which holds what the statement took from its budgets and the storage it was decided in.
//
// The front end owns the Exec and reuses it, one statement after another, so that deciding a
// statement allocates nothing (the database/sql driver keeps one per connection and one per rows
// wrapper). Its lifecycle:
//
//  1. ctx, err := Begin(ctx, x, …) decides the statement into x. On an error nothing is held
//     and the statement must not be sent; x needs no Finish.
//  2. On nil the statement may run: the front end sends it, and keeps the ctx Begin returned
//     (it carries the observer's span, see [Observer]). x.Result is valid and read-only for
//     the front end until x's next Begin.
//  3. x.Finish(ctx, err) once the statement has completed (its rows closed), with that ctx,
//     exactly once, on every path, a panic included: it gives back what the statement held.
//
// An Exec is not safe for concurrent use and holds one statement at a time: it may begin the next
// only after the last one's Finish. The zero value is ready for Begin.
type Exec struct {
	Result
	work
}

// Result is what Begin decided about a statement: what the front end (the outgoing
// sqlcommenter, the error of a refusal) and the observer (spans and metrics) read. The engine
// writes it during Begin and Finish.
type Result struct {
	// Pattern is the statement's pattern; nil when nothing reads the statement (no rules in
	// force, the observer wants nothing and the debug log is off).
	Pattern *pattern.Pattern
	// Tags are the statement's merged tags (built-in, comment, context; later wins). They are
	// merged only when something reads them: routing the text afresh (a text whose route for
	// these context tags is cached skips it), the guards, the observer's spans or the debug
	// log.
	Tags      []ruleset.KV
	Decision  string   // allow, warn or block
	Reason    string   // the warn or block reason, "" when allowed cleanly
	Blocker   string   // the budget or guard that blocked the statement; "" unless Decision is block
	Budgets   []string // names of the matching budgets that are not off; read-only (shared)
	Predicted float64  // predicted execution seconds; 0 when not predicted
	PlanCost  float64  // planner cost used; 0 when none
	Costed    bool     // a prediction was made (the model may train on this execution)
	Observed  bool     // the observer records this statement's span (Wants had WantSpans at Begin)
	Wants     Wants    // what the observer recorded when the statement began (see Observer.Wants)
	// MaxDuration is the smallest max_duration of the statement's enforce budgets, from Start:
	// the front end cancels the statement past it (see ErrOverrun); 0: no bound.
	MaxDuration time.Duration
	// InBatch says the statement was sent in a pgx batch (Batch): the observer's Finished ends
	// its span, and BatchFinished records the batch's duration once, as one operation.
	InBatch bool
	// Resumed says an earlier decision of the same statement began its span, which this one
	// continues (a statement of the pool decided again: see Exec.Abandon): the context the
	// observer's Started or Blocked is given carries that span, to annotate with this decision
	// and to end, not to start another beside.
	Resumed bool
}

// work is an Exec's private part: the statement's holds and clock, and the storage the engine
// decides in, kept from one statement to the next. Only the engine reads or writes it.
type work struct {
	e       *Engine
	start   time.Time // see Start; zero when nothing read the clock
	pricing           // what the decision made of its cost
	// later: the statement has no connection yet (from BeginBeforeConn to Acquired).
	later bool
	// taken: the statement is decided on a connection the pool lent it alone (BeginTaken),
	// which it gives back rather than wait for health there (ErrWaitBeforeConn).
	taken bool
	// arrived is when the statement first asked for room: its max_wait counts from it, also
	// when it is decided again (again), and when an admission on its connection (Acquired)
	// began. Kept across reset.
	arrived time.Time
	// st is the rule set that admitted a statement before its connection (later), which
	// Acquired admits it under again when its slots were overtaken meanwhile; set by decide,
	// and cleared by Acquired or Abandon (one of which follows every such admission), so that
	// an Exec kept for reuse pins no old rules.
	st *compiled
	// guarded: the query guards apply to it (its pattern has an unsafe write or a TRUNCATE, and
	// its context does not bypass them): its enforce guards decided it, and its warn guards note
	// it once it is decided (warnGuards).
	guarded bool
	// again is the call that decides the statement again (kept across reset): BeginTaken on
	// the connection taken for its EXPLAIN (after ErrNeedConn) or after Acquired's
	// ErrDecideAgain, BeginBeforeConn after ErrWaitBeforeConn. That decision is the same
	// statement's, in its place of arrival in the queues, its max_wait counted from its
	// arrival. Any other call begins a new statement (one whose connection never came left
	// again set); onHeld, the zero value, names none (resumes).
	again connState
	// spanned is the context carrying the span an earlier decision of the statement began,
	// kept by Abandon for the decision again names, which continues it (Result.Resumed) and
	// hands it to the observer (spanContext); nil otherwise.
	spanned context.Context
	// rng samples the statements the model trains on: each Exec has its own, used by its one
	// owner, seeded at random on first use.
	rng    rand.PCG
	seeded bool
	holds  []budget.Request
	warned []Warning
	s      scratch
	// bound names the budget of MaxDuration (nil: none), selected by boundRule; warnBounds are
	// its warn budgets with a max_duration, which Finish checks (overrun.go).
	bound      *budgetState
	boundRule  string
	overrun    error // the cause of its context past MaxDuration (Overrun)
	warnBounds []warnBound
	// quarantinable are the statement's budgets with a quarantine, whose strikes Finish counts.
	quarantinable []*budgetState
}

// pricing is what a decision made of a statement's cost: where its prediction came from, and
// whether it runs as its pattern's probe. A decision made again under new rules makes it afresh
// (undecide).
type pricing struct {
	warm bool // the prediction came from a pattern past warmSamples executions
	// server: the prediction is on the server's clock (cost.Prediction.Server), and is what
	// Finish charges; else Finish charges the client's measurement, which the server's report
	// of the pattern trues up when it is identified (serverclock.go).
	server, identified bool
	// untrained: the pattern had no observed execution, so its cost is unknown (decide.go).
	untrained bool
	// probe: budgets refused the statement's prediction for good, and it runs instead as its
	// pattern's probe, at an unknown cost and bounded by the smallest such limit (admission.go).
	probe bool
	// explained: PlanCost is the statement's own, from its EXPLAIN, not the pattern's cached one.
	explained bool
	// perCall: the statement's pattern is explained per call (explain: call, or a volatile
	// pattern under auto), its cost varying with its arguments: a cached plan cost that priced
	// it (a pool statement decided before its connection, an EXPLAIN that failed) is another
	// call's.
	perCall bool
	// explainFailed: the statement's EXPLAIN failed, and the pattern's plan was cached as
	// failed (cost.Model.PutPlanFailed).
	explainFailed bool
}

// scratch is the storage an Exec decides in, kept from one statement to the next.
type scratch struct {
	tags   []ruleset.KV
	rules  []int
	rt     route
	claim  claim         // its admission (admission.go), with the storage of its warnings
	waiter budget.Waiter // its place in the budgets' queues while it waits
}

// reset readies x for a statement of p: a new Result, and the work's per-statement fields
// cleared with its storage kept.
func (x *Exec) reset(e *Engine, p *pattern.Pattern) {
	x.Result = Result{Pattern: p, Decision: DecisionAllow}
	x.e, x.start, x.pricing, x.guarded = e, time.Time{}, pricing{}, false
	x.bound = nil
	clear(x.warnBounds) // let the budgets of replaced rules go
	x.warnBounds = x.warnBounds[:0]
	clear(x.quarantinable) // let the budgets of replaced rules go
	x.quarantinable = x.quarantinable[:0]
	x.holds, x.warned = x.holds[:0], x.warned[:0]
}

// undecide clears what a decision of x set before its admission, which the rules replaced
// while it waited (errRulesChanged): its budgets, its prediction and whether it is a probe were
// the old rules' (it holds nothing).
func (x *Exec) undecide() {
	x.Budgets, x.Predicted, x.PlanCost, x.Costed = nil, 0, 0, false
	x.pricing = pricing{}
}

// Conn is the connection a statement will run on, as the engine uses it: to EXPLAIN the
// statement there for its planner cost, never to send it. It returns the plan's total cost in
// planner units and the server's query identifier of the statement (0: none); an error
// wrapping [cost.ErrNotSent] means nothing reached the server. The front end implements it over
// its driver's connection (internal/cost/pgxexplain).
type Conn interface {
	Explain(ctx context.Context, query string, args []any) (cost.Plan, error)
	// InTransaction reports whether the connection is inside a transaction block, whose
	// locks another session's EXPLAIN of the statement's pattern may wait for.
	InTransaction() bool
}

// Begin decides whether a statement may run, into x (see [Exec] for the lifecycle). It is the
// engine's one entry point for every front end.
//
//   - ctx is the caller's context: its tags (tagging) route the statement, its end stops a wait
//     for capacity, and it bounds the EXPLAIN.
//   - conn is the connection the statement will run on, as a [Conn] (the driver's
//     pgxexplain.On of (*stdlib.Conn).Conn() under database/sql, of (*pgxpool.Conn).Conn() or a
//     pgx.Tx's Conn() under pgxpool). The front end holds it, so nothing else uses it while
//     Begin runs; Begin uses it only for EXPLAIN. nil means no EXPLAIN: the cost is predicted
//     from history.
//   - query is the statement's SQL text, as the front end will send it (not a prepared
//     statement's name).
//   - args are its arguments as Go values, as pgx's Query takes them: leading pgx options
//     (QueryExecMode, result formats, a QueryRewriter such as pgx.NamedArgs) are honoured as pgx
//     would honour them. Begin reads them only during the call and keeps no reference: the front
//     end may reuse the slice when it returns.
//
// When a budget of the statement needs a planner cost, Begin asks conn to EXPLAIN the statement
// with its arguments (pgxexplain.Explain: never executed, in a savepoint when conn is in a
// transaction, nothing sent when conn is busy, closed or in an aborted transaction). A failed
// EXPLAIN falls back to history and never fails the statement.
//
// Begin returns nil when the statement may run (then x must be finished with Finish when it
// completes), a *Denial when it is blocked (nothing may be sent), or ctx's error when ctx ended
// while waiting for capacity. On an error nothing has been taken from any budget and x needs no
// Finish. If code Begin calls panics (an observer, a logger, a query rewriter), Begin gives back
// what it took before the panic goes on, and x needs no Finish.
//
// With nil it returns the statement's context: ctx, or the context the observer's Started
// returned (carrying the statement's span), as a pgx QueryTracer's TraceQueryStart returns
// one. The front end passes it to Finish, which hands it back to the observer, as pgx hands
// TraceQueryStart's context to TraceQueryEnd: the statement's telemetry travels in it.
func (e *Engine) Begin(ctx context.Context, x *Exec, conn Conn, query string, args []any) (context.Context, error) {
	return e.begin(ctx, x, onHeld, &call{conn: conn, query: query, args: args})
}

// connState is the connection a statement or a batch has while the engine decides it.
type connState uint8

const (
	onHeld     connState = iota // one its caller holds (Begin, BeginBatch)
	beforeConn                  // none yet: it takes one once admitted (BeginBeforeConn)
	onTaken                     // one the pool lent it alone, before it was admitted (BeginTaken)
)

// resumes reports whether a decision at at is the one again names (work.again,
// batchWork.again): the same statement's or batch's, decided again. A decision on a held
// connection never is one: such a statement is decided once.
func resumes(again, at connState) bool { return at != onHeld && at == again }

// call is a statement as its front end asks to run it: the connection it will run on (nil
// before it has one: no EXPLAIN), its SQL text and its arguments, as Begin received them. The
// engine reads them only while it decides the statement.
type call struct {
	conn  Conn
	query string
	args  []any
}

// ErrNeedConn is BeginBeforeConn's and BeginBatchBeforeConn's answer for a statement whose cost
// needs an EXPLAIN on its connection: nothing was decided or taken. Its decision on the
// connection (BeginTaken, BeginBatchTaken) is the same statement's: in the place of arrival it
// took in its budgets' queues if it waited before its connection, its max_wait counted from
// its arrival.
var ErrNeedConn = errors.New("engine: the statement's cost needs an EXPLAIN on its connection")

// ErrWaitBeforeConn is the answer of BeginTaken, BeginBatchTaken and Acquired for a statement
// or batch of the pool that a health threshold holds back while it has a connection taken from
// the pool for it alone: it holds nothing, and does not wait there holding that connection. The
// front end gives the connection back and decides it again before it has one (BeginBeforeConn,
// BeginBatchBeforeConn), which waits for health holding none, in its place of arrival, its
// max_wait counted from its arrival as before. BeginTaken answers it too for a statement whose
// connection closed under its EXPLAIN (cost.ErrConnLost): decided again before another.
var ErrWaitBeforeConn = errors.New("engine: held back for health on a connection taken for it; decide it again before its connection")

// ErrDecideAgain is Exec.Acquired's and Batch.Acquired's answer for a statement or batch
// whose slots were overtaken while it waited for its connection, and whose rules were replaced
// while it then waited for room under them: it holds nothing, and its route is the old rules'.
// The front end ends it (Abandon) and decides it afresh on the connection it now holds
// (BeginTaken, BeginBatchTaken), under the rules in force.
var ErrDecideAgain = errors.New("engine: the rules changed while the statement waited; decide it again on its connection")

// BeginBeforeConn is Begin for a statement that has no connection yet: the pgx-native pool
// decides a statement before it takes a connection from the pool, so that a refused statement
// never waits for one and a statement waiting for capacity holds none. It decides as Begin does,
// except when the statement's cost needs an EXPLAIN (a pattern not yet costed under a budget
// with a bucket or a per_query_limit, explain: call): then it checks only what refuses the
// statement whatever it costs and its budgets' room for a cost not yet known (precheck),
// waiting for them as max_wait allows, takes nothing and returns ErrNeedConn, and the front end
// acquires the connection and calls BeginTaken with it.
//
// Once it admits the statement the front end acquires the connection, still holding the
// statement's slots, and then calls [Exec.Acquired], so that the wait for the pool is not
// counted as the statement's cost; if the acquisition fails, or Acquired refuses the statement,
// it calls [Exec.Abandon] instead of Finish, with the context BeginBeforeConn returned.
//
// Until Acquired its slots are pending (budget.Request.Pending): a statement that holds a
// connection (a transaction's, a PoolConn's, one that had to EXPLAIN first) is never held up
// by them, as they may be waiting for the very connection it holds.
func (e *Engine) BeginBeforeConn(ctx context.Context, x *Exec, query string, args []any) (context.Context, error) {
	return e.begin(ctx, x, beforeConn, &call{query: query, args: args})
}

// BeginTaken is Begin for a statement of the pool on conn, a connection taken from the pool for
// it alone before it was admitted: to EXPLAIN it there (after BeginBeforeConn's ErrNeedConn),
// or to decide it again there (after Acquired's ErrDecideAgain). Its caller holds no connection
// of its own that the statement must wait on, so when a health threshold holds it back, it does
// not wait for health holding this one: BeginTaken returns ErrWaitBeforeConn, and the front end
// gives the connection back and decides the statement again with BeginBeforeConn (its pattern's
// plan, cached by the EXPLAIN, prices it there). What no wait lifts (a zero limit, a
// quarantine) refuses it as Begin does; a wait for capacity (max_wait) holds the connection,
// until it is admitted or a health threshold holds it back (ErrWaitBeforeConn then too).
func (e *Engine) BeginTaken(ctx context.Context, x *Exec, conn Conn, query string, args []any) (context.Context, error) {
	return e.begin(ctx, x, onTaken, &call{conn: conn, query: query, args: args})
}

// begin is Begin (at onHeld), BeginBeforeConn (beforeConn: c.conn is nil, and comes after the
// decision) and BeginTaken (onTaken), for statement c.
func (e *Engine) begin(ctx context.Context, x *Exec, at connState, c *call) (context.Context, error) {
	later := at == beforeConn
	st := e.state.Load()
	if !resumes(x.again, at) {
		x.spanned = nil // a new statement: nothing of an earlier one's goes on
	}
	var wants Wants
	if e.obs != nil {
		wants = e.obs.Wants() | x.resumedWants()
	}
	debug := e.log.Enabled(ctx, slog.LevelDebug)
	// With no rules in force, telemetry idle and no debug log, nothing reads the statement: its
	// pattern, its time and its tags are not looked up (Result.Pattern is nil).
	read := !st.empty || wants != 0 || debug
	var p *pattern.Pattern
	var text *textEntry
	if read {
		p, text = e.texts.get(c.query, e.patterns)
	}
	x.reset(e, p)
	x.Wants, x.Observed, x.later, x.taken = wants, wants&WantSpans != 0, later, at == onTaken
	x.Resumed = x.spanned != nil
	begun := false
	if read {
		// What a statement read may take (budgets' holds, the observer's span) is given back if
		// Begin does not succeed, a panic included. One that is not read takes nothing.
		defer func() {
			if !begun {
				x.unwind()
			}
		}()
		// A transaction's own statements are never decided (pattern.Pattern.Transaction).
		if st.empty || p.Transaction {
			e.observeStatement(ctx, x, debug, c.query)
		} else if err := e.decideStatement(ctx, st, x, at, text, debug, c); err != nil {
			return nil, err
		}
	}
	if x.Observed {
		ctx = e.obs.Started(x.spanContext(ctx), x)
	}
	if !later {
		e.inFlight.Add(1)
	} else {
		e.pending.Add(1) // in flight from Acquired
	}
	begun = true
	return ctx, nil
}

// unwind gives back what a Begin that did not succeed may hold: its budgets' holds (the
// statement never ran). After a denial it finds nothing; after a panic it is
// what keeps the slots from leaking.
func (x *Exec) unwind() {
	if len(x.holds) > 0 {
		giveBack(x.e.now(), x.holds)
		x.holds = x.holds[:0]
	}
}

// giveBack gives holds back at now at no cost: their statement never ran (refused, abandoned,
// decided again). Nothing is learned from them.
func giveBack(now time.Time, holds []budget.Request) {
	for i := range holds {
		budget.Return(now, &holds[i])
	}
}

// leave takes n statements that end without having run out of the engine's count: of those in
// flight, or while they waited for their connection (later) of the pending ones.
func (e *Engine) leave(n int, later bool) {
	if later {
		e.pending.Add(-int64(n))
	} else {
		e.inFlight.Add(-int64(n))
	}
	e.ends.ended()
}

// connected moves n statements admitted before their connection (pending) to those in
// flight: their connection is acquired (Exec.Acquired, Batch.Acquired).
func (e *Engine) connected(n int) {
	e.pending.Add(-int64(n))
	e.inFlight.Add(int64(n))
}

// observeStatement is Begin's work for a statement read with no rules in force, only for the
// observer or the debug log: its clock starts when the observer wants it, and its tags are
// merged when the span or the log shows them.
func (e *Engine) observeStatement(ctx context.Context, x *Exec, debug bool, query string) {
	if x.Wants != 0 {
		x.start = e.now()
	}
	if x.Observed || debug {
		e.tagStatement(tagging.From(ctx), x, query)
	}
	if debug {
		e.debugStatement(ctx, x)
	}
}

// decideStatement is Begin's work for statement c under st's rules, at at: it starts the
// statement's clock, routes it and decides it. A statement whose rules were replaced while it
// waited for room is routed and decided again under the rules in force, its max_wait still
// counted from its arrival, as is one decided again by the call x.again names.
func (e *Engine) decideStatement(ctx context.Context, st *compiled, x *Exec, at connState, text *textEntry,
	debug bool, c *call) error {
	x.start = e.now()
	if !resumes(x.again, at) {
		x.s.waiter.Forget() // a new statement: at the back of any queue it joins
		x.arrived = x.start
	}
	x.again = onHeld
	rt := e.routeStatement(ctx, st, x, text, debug, c.query)
	slow, err := e.decide(ctx, st, x, rt, c)
	for err == errRulesChanged {
		x.undecide()
		x.start = e.now()
		st = e.state.Load()
		rt = e.routeStatement(ctx, st, x, text, debug, c.query)
		slow, err = e.decide(ctx, st, x, rt, c)
	}
	e.warnGuards(st, x, err)
	if err != nil {
		// ErrNeedConn and ErrWaitBeforeConn decided nothing: the front end decides the
		// statement again, with its connection or before it.
		if err != ErrNeedConn && err != ErrWaitBeforeConn && e.obs != nil {
			e.obs.Blocked(x.spanContext(ctx), x, err)
		}
		return err
	}
	if slow || debug || len(x.warned) > 0 {
		// An EXPLAIN, a wait for capacity or the log's handler (the application's code, which
		// a warning or the debug log ran) is not the statement's cost: measure from here.
		x.start = e.now()
	}
	return nil
}

// routeStatement routes x under st: the route the text was given for the same context tags
// when it has one, else a new one from x's merged tags, saved for the next time. It merges
// x's tags when the route or something else reads them.
func (e *Engine) routeStatement(ctx context.Context, st *compiled, x *Exec, text *textEntry, debug bool,
	query string) *route {
	p := x.Pattern
	ctxTags := tagging.From(ctx)
	// Guards read the merged tags: a statement they may apply to routes afresh.
	guarded := p.UnsafeWrite || p.Truncate
	var rt *route
	if !guarded {
		rt = text.routeFor(st, ctxTags, x.start)
	}
	if rt == nil || x.Observed || debug {
		e.tagStatement(ctxTags, x, query)
	}
	if debug {
		e.debugStatement(ctx, x)
	}
	if rt == nil {
		rt = &x.s.rt
		x.s.rules = st.route(x.Tags, rt, x.s.rules, x.start)
		if !guarded {
			text.save(st, ctxTags, rt, x.start)
		}
	}
	return rt
}

// tagStatement merges x's tags (mergeTags), in its storage.
func (e *Engine) tagStatement(ctxTags tagging.Tags, x *Exec, query string) {
	x.Tags = e.mergeTags(ctxTags, x.s.tags[:0], x.Pattern, query)
	x.s.tags = x.Tags
}

// Start returns when the statement began (when its admission was decided: the engine restarts
// it after an EXPLAIN or a wait for capacity). It is the zero Time when nothing read the clock
// at Begin: no rules were in force and telemetry was idle.
func (x *Exec) Start() time.Time { return x.start }

// Arrived returns when the engine began deciding the statement, which Start follows by the
// time it spent on an EXPLAIN or waiting for capacity: its span starts here, so that this time
// shows in the caller's trace. Read it only from the observer's Started and Blocked, for a
// statement with budgets or refused (a statement no rule reads is not given one). After
// Acquired it is when the statement had its connection (Held).
func (x *Exec) Arrived() time.Time { return x.arrived }

// Held reports how long the engine held x back before admitting it: from its arrival (Arrived)
// to its start (Start), the time of an EXPLAIN sent or waited for, or of a wait for capacity; 0
// for a statement no budget reads, which nothing holds back. The front end reads it to check a
// connection that sat idle meanwhile before it sends the statement there: the server, or a
// proxy, may have closed it. For a statement of the pool decided on a connection it took
// (BeginTaken) it counts from its first arrival, a wait before that connection included; after
// Acquired it counts only a wait on the connection (overtaken, admitted again there), not the
// wait for the pool, which checks a connection idle for long before it hands it out. Read it
// between Begin and Finish.
func (x *Exec) Held() time.Duration {
	// Start is a copy of Arrived until the engine restarts it: the comparison spares the
	// statements nothing held back (most) a subtraction of two times.
	if len(x.Budgets) == 0 || x.start == x.arrived {
		return 0
	}
	return x.start.Sub(x.arrived)
}

// Acquired tells x, admitted by BeginBeforeConn, that its connection is acquired: its clock
// restarts, so that the wait for the pool is not counted as its cost or against its
// max_duration, and its pending slots become running ones (budget.Connect). When statements on
// held connections overtook a slot of x's meanwhile, so that x would now run past a
// max_concurrent, x gives back what its enforce budgets hold and is admitted again, now on its
// connection, as any statement on a held connection is: it may wait in the budgets' queues up
// to max_wait (its clock restarts after the wait); but held back by a health threshold, it
// does not wait for health on the connection (see ErrWaitBeforeConn). ctx is the context
// BeginBeforeConn returned.
//
// Acquired returns nil when x may run. Else it returns the *Denial of that admission (counted
// and recorded as any refusal), ctx's error when ctx ended while x waited, ErrDecideAgain
// when the rules were replaced while x waited, or ErrWaitBeforeConn; x then holds nothing, and
// the front end calls Abandon and gives the connection back (on ErrWaitBeforeConn it decides
// the statement again before a connection), or on ErrDecideAgain decides the statement again
// on it.
func (x *Exec) Acquired(ctx context.Context) error {
	x.later = false
	x.e.connected(1)
	if x.start.IsZero() {
		return nil
	}
	st := x.st
	x.st = nil
	// From here Arrived is when x had its connection, so that Held counts only a wait on it
	// (admitAgain): the pool checked the connection it handed out.
	x.start = x.e.now()
	x.arrived = x.start
	if st != nil && st != x.e.state.Load() {
		// The rules were replaced while x waited for its connection (a budget closed by a zero
		// limit, a limit lowered, a rule removed): x gives back what it holds and is decided
		// again on its connection under the rules in force, as when they are replaced while it
		// waits there (admitAgain), in its place of arrival.
		giveBack(x.start, x.holds)
		x.holds = x.holds[:0]
		x.again = onTaken
		return ErrDecideAgain
	}
	for i := range x.holds {
		if !budget.Connect(x.start, &x.holds[i]) {
			err := x.admitAgain(ctx, st, i)
			if err == nil {
				x.countLater(st)
			}
			return err
		}
	}
	x.countLater(st)
	return nil
}

// countLater counts the decisions of x, admitted under st before it had its connection, once
// they are final: when it is admitted on its connection (Acquired), or abandoned before it had
// one (Abandon). One refused on its connection counts that refusal instead (admitAgain), and one
// decided again counts that decision: one decision per statement. st nil: x was not admitted
// before its connection, or its decisions are counted.
func (x *Exec) countLater(st *compiled) {
	if st != nil {
		x.e.decisions(st, x, x.s.claim.rt)
	}
}

// admitAgain admits x, whose hold gone was overtaken (budget.Connect gave it back), again under
// st, the rule set that decided it, as a statement on its connection: the other holds of its
// enforce budgets go back at no cost, and its route's requests are asked again at its
// prediction (a probe's unknown cost for a probe), through the one admission path (admit), with
// its claim. On a refusal its warn budgets' holds go back too and x holds nothing; the observer
// counts a block, as the budget does: the statement's one decision (countLater).
func (x *Exec) admitAgain(ctx context.Context, st *compiled, gone int) error {
	e, c := x.e, &x.s.claim
	n := len(c.rt.reqs) // x.holds[:n] are its enforce budgets', x.holds[n:] its warn budgets'
	for i := range x.holds[:n] {
		if i != gone {
			budget.Return(x.start, &x.holds[i]) // never ran
		}
	}
	for i, r := range c.rt.reqs {
		r.Cost, r.Unknown = x.Predicted, x.untrained
		if x.probe {
			r.Cost, r.Unknown = 0, true
		}
		x.holds[i] = r
	}
	c.reqs, c.lent = x.holds[:n], true
	again, err := e.readmit(ctx, st, c, &x.start, &x.arrived)
	x.again = decidedAgainAt(again, err, x.again)
	if err != nil {
		giveBack(x.start, x.holds[n:])
		x.holds = x.holds[:0]
		if x.Decision == DecisionBlock && x.Wants&WantDecisions != 0 { // refused, or kept out until ctx ended
			e.obs.Decision(x.Blocker, DecisionBlock, x.Reason)
		}
	}
	return err
}

// decidedAgainAt is where a statement or batch admitted again after its slots were overtaken
// (readmit's again and err) is decided next: on its connection when the rules were replaced
// meanwhile (ErrDecideAgain), before one when a health threshold held it back (not on the
// connection the pool lent it alone: ErrWaitBeforeConn), else where at says.
func decidedAgainAt(again bool, err error, at connState) connState {
	switch {
	case again:
		return onTaken
	case err == ErrWaitBeforeConn:
		return beforeConn
	}
	return at
}

// Abandon ends x, admitted by BeginBeforeConn, when no connection could be acquired for it
// (err, the pool's error: the caller's context ended, the pool closed) or Acquired refused it
// (err, its error): it gives back whatever slots it still holds and the cost it reserved,
// learns nothing, and tells the observer that it ended with err. Call it instead of Finish,
// with the context BeginBeforeConn returned. It ends as well a statement admitted by Begin or
// BeginTaken that the front end does not send after all (its connection closed while the
// engine held it back), with the context they returned: nothing ran.
//
// Abandoned with Acquired's ErrDecideAgain or ErrWaitBeforeConn, x does not end: the front end
// decides it again (BeginTaken, BeginBeforeConn), and the observer hears of it once, at its
// end. That decision continues the span this one began (Result.Resumed): ctx carries it, and
// the engine keeps it until then. A front end that decides x again before a connection for a
// reason of its own (the connection x was decided on closed while the engine held x back there)
// abandons it with ErrWaitBeforeConn too: x keeps its span and its place of arrival.
func (x *Exec) Abandon(ctx context.Context, err error) {
	e := x.e
	e.leave(1, x.later)
	x.countLater(x.st) // admitted, its connection never came: that decision stands
	x.st = nil
	if x.start.IsZero() {
		return
	}
	now := e.now()
	giveBack(now, x.holds)
	x.holds = x.holds[:0]
	if decidedAgain(err) {
		x.again = decidedAgainAt(false, err, x.again)
		x.keepSpan(ctx)
		return
	}
	if x.Wants&(WantSpans|WantDuration) != 0 {
		e.obs.Finished(ctx, x, err, now.Sub(x.start))
	}
}

// decidedAgain reports whether err, given to Abandon, is one of Acquired's answers that
// send a statement or batch to be decided again rather than end it.
func decidedAgain(err error) bool { return err == ErrDecideAgain || err == ErrWaitBeforeConn }

// keepSpan keeps ctx, the context of x's decision that Abandon gave up to decide x again, for
// that next decision, when it carries x's span.
func (x *Exec) keepSpan(ctx context.Context) {
	if x.Observed {
		x.spanned = ctx
	}
}

// resumedWants is what the observer must be asked of x whatever its Wants say now: its span,
// when an earlier decision began it (spanned), which only its Finished or Blocked ends.
func (x *Exec) resumedWants() Wants {
	if x.spanned != nil {
		return WantSpans
	}
	return 0
}

// spanContext returns the context for the observer's Started or Blocked of x at this decision:
// the one that carries the span of an earlier decision of x (Result.Resumed), handed over
// once, else ctx.
func (x *Exec) spanContext(ctx context.Context) context.Context {
	if c := x.spanned; c != nil {
		x.spanned = nil
		return c
	}
	return ctx
}

// EndUndecided ends x, which BeginBeforeConn answered ErrNeedConn, when the connection its
// EXPLAIN needs could not be taken (err, the pool's error: the caller's context ended, the pool
// closed). It holds nothing; the observer is told that it ended with err before it was
// decided (its span, no decision counted), as one whose context ended during its EXPLAIN is.
func (x *Exec) EndUndecided(ctx context.Context, err error) {
	if x.e.obs != nil {
		x.e.obs.Blocked(x.spanContext(ctx), x, err)
	}
}

// Finish ends the statement that x's Begin admitted, once it has completed: it releases the
// statement's holds, trues its debt up to its cost, trains the cost model and tells the
// observer. Its cost is its prediction when that is on the server's clock (the server reports
// what its pattern takes, see ObserveServer), else the time it took less the network's round
// trip (SetNetworkFloor). ctx is the context Begin returned; err is the statement's outcome:
// nil on success, else its error (a front end that recovers a panic passes a non-nil error); a
// cancelled or failed statement does not train the model. Call it exactly once per successful Begin, on
// every path out of the front end (defer it), and not after a Begin that returned an error.
func (x *Exec) Finish(ctx context.Context, err error) {
	e := x.e
	e.inFlight.Add(-1)
	e.ends.ended()
	if x.start.IsZero() {
		return // no rules were in force and telemetry was idle: nothing to account
	}
	now := e.now()
	took := now.Sub(x.start)
	actual := float64(lessFloor(took, e.floor.Load())) / 1e9
	charge := actual
	switch {
	case x.server && err == nil:
		charge = x.Predicted // the server's clock: its reports true the prediction up, not this measurement
	case x.server:
		// The server reports no statement that failed or was cancelled: nothing would true the
		// prediction up. It is charged what it took on the client's clock, at least that.
		charge = max(x.Predicted, actual)
	}
	overran := x.cutOff(err)
	if len(x.quarantinable) > 0 {
		// Before its slots go back: a waiter they admit finds the quarantine this run began.
		e.strikes(x, overran, took, charge, now)
	}
	for i := range x.holds {
		budget.Release(now, &x.holds[i], charge)
	}
	// Only a completed statement is among what the server reports of its pattern, which trues a
	// charge on the client's clock up (serverclock.go).
	if err == nil && !x.server && x.identified && len(x.holds) > 0 && e.clientCharges.wanted(now) {
		e.clientCharges.add(x.Pattern.FingerprintID, x.holds, charge, 1, now)
	}
	if x.bound != nil || len(x.warnBounds) > 0 {
		e.overran(x, overran, took, now)
	}
	// A statement cut off at its max_duration ran at least that long: a lower bound worth
	// learning, except from a probe, whose bound is the limit its prediction exceeded (that
	// prediction stands).
	if (err == nil || overran && !x.probe) && x.Costed {
		if runs := x.train(); runs > 0 && ctx.Err() == nil {
			e.model.Observe(x.Pattern.FingerprintID, x.Pattern.Normalized, x.taught(), actual, x.explained, runs)
		}
	}
	if err != nil && x.explainFailed {
		// Its EXPLAIN failed and so did the statement: the failure was likely the statement's
		// own (a table its migration has not made yet), not one of the EXPLAIN alone that
		// would fail at every execution. The next one is explained again, not left unpriced.
		e.model.ForgetPlanFailed(x.Pattern.FingerprintID)
	}
	if x.Wants&(WantSpans|WantDuration) != 0 {
		e.obs.Finished(ctx, x, err, took)
	}
}

// taught is the plan cost x's execution teaches its pattern's k with (cost.Model.Observe): its
// PlanCost, but none when that is the pattern's cached plan cost of other statements, perhaps
// of other arguments: the refused ones' for a probe, whose time over it would teach a k that
// prices them as cheap as the probe; another call's for a pattern whose cost varies with them
// (perCall).
func (x *Exec) taught() float64 {
	if !x.explained && (x.probe || x.perCall) {
		return 0
	}
	return x.PlanCost
}

// lessFloor is took less floor, the network's round trip (SetNetworkFloor), but at least a tenth
// of took: a floor measured on another connection, or inflated by the client's own load, must
// not make a statement free.
func lessFloor(took time.Duration, floor int64) time.Duration {
	return max(took-time.Duration(floor), took/10)
}

// Training the cost model costs more than the rest of a decision, and a pattern's averages weigh
// only the last ten or so samples. So after warmSamples executions a pattern trains on a random
// one in trainEvery of its cheap statements (at random: every n-th could lock onto a periodic
// workload), and on every statement predicted at trainAlways or more, the ones budgets exist
// for. The choice is made by the prediction, before the statement runs, never by what it
// took: keeping every slow execution and a sixteenth of the fast ones would weigh the slow ones
// sixteen times over, and teach a pattern that is mostly fast the cost of its outliers (and a
// client under load, its statements slowed past trainAlways, would train on all of them).
const (
	warmSamples = 64
	trainEvery  = 16
	trainAlways = time.Millisecond
)

// train reports whether the model trains on x's execution: 0 when it does not, else how many
// of the pattern's executions this one stands for (cost.Model.Observe's runs): 1 when every one
// is trained on, trainEvery for one drawn at random among the cheap ones.
func (x *Exec) train() (runs uint64) {
	if !x.warm || x.probe || x.Predicted >= trainAlways.Seconds() {
		return 1
	}
	if !x.seeded {
		x.rng.Seed(rand.Uint64(), rand.Uint64())
		x.seeded = true
	}
	if x.rng.Uint64()%trainEvery == 0 {
		return trainEvery
	}
	return 0
}

// mergeTags builds the statement's tags: the built-in tags, then the sqlcommenter tags of the
// statement's comment, then ctxTags (the context's tags), a context tag replacing a comment tag
// with the same key. The built-in tags are facts of the connection and the statement, which
// neither a comment nor the context can replace: their pairs with a built-in key are dropped,
// whether or not the statement has that tag (a comment can be injected, and /*table='x'*/ would
// otherwise take a statement out of its {table: gt} budget and guards). p nil (Check) has no
// pattern tags and no comment.
func (e *Engine) mergeTags(ctxTags tagging.Tags, dst []ruleset.KV, p *pattern.Pattern, query string) []ruleset.KV {
	dst = append(dst, e.builtins...)
	if p != nil {
		dst = append(dst, ruleset.KV{Key: vocab.KeyFingerprint, Value: p.Fingerprint}, ruleset.KV{Key: vocab.KeyStatement, Value: p.Kind})
		for _, t := range p.Tables {
			dst = append(dst, ruleset.KV{Key: vocab.KeyTable, Value: t})
		}
		for _, t := range p.Relations { // a qualified table's bare name too: {table: orders} matches public.orders
			dst = append(dst, ruleset.KV{Key: vocab.KeyTable, Value: t})
		}
	}
	if name := queryName(query); name != "" {
		dst = append(dst, ruleset.KV{Key: vocab.KeyQueryName, Value: name})
	}
	if strings.Contains(query, "/*") {
		for k, v := range tagging.Parse(query).All() {
			if _, ok := ctxTags.Get(k); !ok && !builtinKey(k) {
				dst = append(dst, ruleset.KV{Key: k, Value: v})
			}
		}
	}
	for k, v := range ctxTags.All() {
		if !builtinKey(k) {
			dst = append(dst, ruleset.KV{Key: k, Value: v})
		}
	}
	return dst
}

// builtinKey reports whether k is the key of a built-in tag.
func builtinKey(k string) bool {
	switch k {
	case vocab.KeyUsername, vocab.KeyDatabase, vocab.KeyApplicationName, vocab.KeyFingerprint, vocab.KeyStatement, vocab.KeyTable, vocab.KeyQueryName:
		return true
	}
	return false
}

// debugStatement logs a statement's pattern and merged tags at debug level. Tags are metadata
// chosen by the application; the statement text is logged normalised, never raw.
func (e *Engine) debugStatement(ctx context.Context, x *Exec) {
	attrs := make([]any, 0, len(x.Tags)+3)
	attrs = append(attrs, fingerprintAttr(x.Pattern), slog.String("query", x.Pattern.Normalized))
	tags := make([]any, 0, len(x.Tags))
	for _, kv := range x.Tags {
		// Cut and made valid UTF-8 as a span's tag attributes are: a context tag is the
		// application's, of any size.
		tags = append(tags, slog.String(bounded.Text(kv.Key, bounded.KeyLen), bounded.Text(kv.Value, bounded.ValueLen)))
	}
	attrs = append(attrs, slog.Group("tags", tags...))
	e.log.DebugContext(ctx, "pgtraffic: statement", attrs...)
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

// Observer sees statements for telemetry. Its methods are called on the statement's goroutine
// and must not block.
//
// What it keeps of a statement between Started and Finished travels in a context, as a pgx
// QueryTracer's does: Started returns ctx carrying the statement's span, Begin hands it to the
// front end, and the front end passes it to Finish, which hands it back to Finished. The Exec
// keeps nothing of the observer's.
type Observer interface {
	// Wants reports what the observer records now, asked once per statement (Exec.Wants):
	// Started runs only with WantSpans, Finished with WantSpans or WantDuration, Decision with
	// WantDecisions; Blocked always runs.
	Wants() Wants
	// Started returns ctx, or a context derived from it that carries what the observer keeps
	// of the admitted statement x (its span). When x.Resumed, ctx is the one an earlier
	// decision's Started returned: the statement is the same, decided again.
	Started(ctx context.Context, x *Exec) context.Context
	// Blocked records x, which was not admitted: nothing was sent. When x.Resumed, ctx is the
	// one an earlier decision's Started returned, as for Started.
	Blocked(ctx context.Context, x *Exec, err error)
	// Finished records x's end, err its outcome and d its execution time. ctx is the context
	// Started returned, when it ran (x.Observed); else the statement's context.
	Finished(ctx context.Context, x *Exec, err error, d time.Duration)
	// BatchFinished records the end of batch b, after its statements' Finished: err is the
	// first of their errors, d the batch's execution time. It runs when its first statement's
	// Wants had WantDuration.
	BatchFinished(ctx context.Context, b *Batch, err error, d time.Duration)
	Decision(budget, decision, reason string)
}

// Wants are the kinds of telemetry an Observer records; see Observer.Wants.
type Wants uint8

const (
	WantSpans     Wants = 1 << iota // a span per statement, with its tags
	WantDuration                    // the duration metric
	WantDecisions                   // the per-budget decision counter
)
