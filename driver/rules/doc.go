// Package rules defines the pgtraffic rules file — budgets, the rules that route statements to
// them, health throttling, static guards and the coordination that shares budgets across an
// application's instances — and parses it strictly from YAML or JSON.
//
// It imports only [vocab] (driver/rules/vocab) and the YAML library (go.yaml.in/yaml/v3):
// nothing under internal/ and no network client, so that code that builds a config pulls in
// nothing else of pgtraffic's.
//
// # A rules file
//
// Every field, with what it means (each is documented where [Config], [Budget], [Rule] and
// [Guards] declare it):
//
//	server_cores: 8            # execution seconds per second the server sustains (default 1)
//	health_interval: 1s        # how often server health and pg_stat_statements are read (default 1s; 10ms to 24h)
//	health_queries:            # custom health metrics: a query returning one number (at most 64, names up to 128 characters)
//	  queue_depth: "select count(*) from jobs where state = 'queued'"
//
//	coordination:              # share budgets across the application's instances (omitted: per process)
//	  redis: rediss://:secret@redis.internal:6379/0   # redis://, rediss:// (TLS) or unix://
//	  sync_interval: 1s        # how often each instance renews its leases (default 1s; 100ms to 1m)
//	  fallback_instances: 10   # instances assumed until Redis is first reached (default 10)
//
//	budgets:
//	  - name: reporting        # required, unique; its state survives reloads while the name stays
//	    mode: enforce          # enforce | warn (default) | off
//	    max_concurrent: 4      # statements of this budget in flight at once
//	    per_query_limit: 2s    # largest predicted cost of one statement
//	    server_share: 0.25     # long-run fraction of server_cores: the bucket drains 0.25 × 8 = 2 s/s
//	    burst_limit: 10s       # bucket size in execution seconds (default share × cores × 1s);
//	                           # a statement predicted above it never fits: refused, per_query_limit
//	    warning_threshold: 0.8 # warn (even in enforce mode) when a limit is 80% full
//	    max_wait: 200ms        # wait up to this long for capacity before blocking
//	    max_queue: 2           # statements waiting at once (default max_concurrent, else 8)
//	    explain: auto          # auto (default) | pattern | call: when EXPLAIN runs
//	    max_duration: 30s      # cancel an admitted statement still running (rows included) after 30s
//	    quarantine:            # refuse for 10m a pattern that overran 3 times within 10m
//	      after: 3             #   (overran: cancelled past max_duration, or measured above per_query_limit)
//	      for: 10m
//
//	  - name: per-tenant
//	    per: tenant            # a separate bucket and concurrency count per value of the tenant tag
//	    server_share: 0.05
//
//	  - name: batch
//	    mode: enforce
//	    shared: false          # per process even with coordination (default true there)
//	    throttle_when:         # admit nothing while any threshold is reached (always per process)
//	      active_queries: 16   # backends active in pg_stat_activity (others' need pg_read_all_stats)
//	      replication_lag: 5s  # standby replay lag (on a primary: its largest replay_lag)
//	      in_flight: 32        # this connector's statements in flight
//	      custom.queue_depth: 1000
//
//	rules:                     # each rule selects a budget; several may apply to one statement
//	  - budget: reporting
//	    match: {app: reporting}
//	  - budget: reporting
//	    match: {app: commerce, controller: export}   # all pairs must hold
//	  - budget: per-tenant
//	    match: {remote_address: 203.0.113.0/24}      # a CIDR prefix: any address inside it
//	  - budget: batch
//	    match: {table: orders, statement: update}    # built-in tags match like any other; table
//	                                                 # matches orders in any schema too
//	  - budget: reporting
//	    match: {controller: export}
//	    until: 2026-12-02T10:00:00Z                  # lapses by itself then: selects nothing, no reload
//
//	guards:
//	  require_where: enforce   # UPDATE, DELETE and MERGE whose condition restricts no rows
//	  block_truncate:          # the scoped form: only statements with these tags
//	    mode: enforce
//	    match: {app: web}
//
// A budget is in warn mode unless it says otherwise: a statement it would block runs, takes no
// slot or debt in that budget, and is logged and counted, so the warnings show what enforce
// would block. With max_wait, enforce would not block a statement over its limits but have it
// wait, and refuse it only once its queue is full (max_queue) or its wait would outlast
// max_wait; so a warn budget lets such a statement run unwarned, counted in the slots and debt
// as one that waited would be, while fewer than max_queue statements that run so would still be
// waiting in enforce (under a max_concurrent, no more than run beyond it: enforce would have
// admitted the others as slots freed) and its wait looks no longer than max_wait: for a slot,
// one mean hold time of the budget's statements (of its per value's, once one has ended) for
// every max_concurrent of them in flight beyond max_concurrent, this one included (the slots in
// use freeing together, as after a burst: of three reports at once under max_concurrent 2 that
// each hold their slot 1.3 s, the third is warned about under max_wait 1s, as enforce refuses
// it), counted as short until a
// statement of the budget has ended in the process (its hold time unknown till then); for
// bucket room, the time the bucket takes to drain enough.
// Warn mode cannot tell how long a health threshold would hold a statement back: it warns about
// each one a threshold holds back, as without max_wait.
//
// Omitted limits are unlimited. An explicit zero blocks in an enforce budget (mode: enforce):
// max_concurrent: 0 refuses every statement its rules select (reason concurrency) and
// server_share: 0 likewise (reason budget), both with a zero RetryAfter, since waiting cannot
// help. In warn mode, the default, such a budget only warns about them.
//
// An enforce budget with max_wait lets a statement it cannot admit at once wait up to max_wait
// for capacity. Waiting statements queue per budget and per value of per, and are admitted in
// arrival order: a statement arriving later takes only the room that those waiting ahead of it
// leave. A statement of several budgets waits in the queue of each, up to the max_wait of the
// one that holds it back (counted from its arrival, whichever refused it first), and in a
// budget that has room for it holds only the room it needs there: a report waiting for a
// narrow budget's slot leaves the rest of a service-wide budget to the statements behind it.
// max_queue bounds how many wait at once, and a statement that finds the queue full is
// refused at once, with a RetryAfter. max_queue: 0 lets none wait (each is refused at
// once, as without max_wait); max_queue without max_wait is an error. Omitted, max_queue is the
// budget's max_concurrent, or [DefaultMaxQueue] (8) for a budget without one
// ([Budget.QueueBound]): under database/sql a waiting statement holds its pool connection, so
// one budget's statements hold at most max_concurrent + max_queue connections, by default
// 2 × max_concurrent, besides, at a deploy, the statements of a new pattern waiting for its
// first EXPLAIN (one round trip, or as long as that EXPLAIN waits on a lock). A longer queue
// mostly fills with statements that wait out their max_wait anyway, since each slot admits one waiter per statement time; without max_concurrent, 8
// keeps the waiters below a typical application pool.
//
// # Incident runbook
//
// Block one query pattern for an hour: take its fingerprint from the status page (recent
// blocks, hottest patterns or quarantines), a span's pgtraffic.fingerprint, or, for a pattern
// no rule selects yet, from its text as pg_stat_statements or pg_stat_activity shows it
// (driver.Fingerprint(text)): 16 hexadecimal digits, anything else is refused as matching no
// statement; then add a closed budget and a rule that lapses:
//
//	budgets:
//	  - {name: incident-block, mode: enforce, max_concurrent: 0}
//	rules:
//	  - budget: incident-block
//	    match: {fingerprint: 5a1d0c7e9b3f2a41}
//	    until: 2026-12-02T15:00:00Z               # now + 1h
//
// Throttle a tenant: a budget per tenant value with a small share, for the statements of that
// tenant only (or of every tenant, by matching a tag they all carry):
//
//	budgets:
//	  - {name: incident-throttle, mode: enforce, per: tenant, server_share: 0.02, burst_limit: 10s, max_wait: 100ms}
//	rules:
//	  - budget: incident-throttle
//	    match: {tenant: acme}
//	    until: 2026-12-02T15:00:00Z
//
// Give it a burst_limit above the tenant's costliest statement: the default bucket holds one
// second of the share (20 ms on one core here), and a statement predicted above it never fits,
// so it is refused outright (per_query_limit) rather than slowed down.
//
// The file is watched: the change applies within a second, and the status lists each rule's
// expiry. Lift it by deleting the rule (and its budget), or let until pass: the rule then
// selects nothing, with no reload. A file that loads with rules whose until has passed
// already (local time taken for UTC) loads with a warning naming them.
// A pattern quarantined by a budget's quarantine is lifted when its for: passes, or at once by
// a reload that changes that budget's quarantine settings (for a shared budget, on every
// instance once the reload reaches it).
//
// # Guards
//
// require_where refuses an UPDATE, DELETE or MERGE whose condition does not restrict the rows
// of the table it writes. A WHERE passes only if it references a column of that table in a way
// that can be false for some row: WHERE id = $1 and WHERE deleted_at IS NULL pass. No WHERE, and
// conditions that do not depend on the target's rows, whatever their form, are unrestricted:
// WHERE true, 1 = 1, $1 = $1, now() > $1, subqueries not correlated with the target,
// comparisons of an expression with itself (id = id, id + 0 = id) and disjunctions that hold for
// every row (x IS NULL OR x IS NOT NULL). AND restricts if any operand does, OR only if every
// operand does. A condition that is never true (false, 1 = 0: what ORMs send for an empty IN
// list) matches no row and passes. A MERGE passes if its ON condition restricts the target, or
// else if its WHEN MATCHED clauses that update or delete do between them: each has a condition
// and their OR restricts (WHEN MATCHED AND x IS NULL THEN UPDATE ... WHEN MATCHED AND x IS NOT
// NULL THEN DELETE is refused under an ON that matches every row).
//
// Text pg_query cannot parse that may hold an UPDATE, DELETE or MERGE (for block_truncate, a
// TRUNCATE) is refused by an enforced guard, whose limit text says so, since its WHERE cannot be
// checked. Out of reach: writes inside DO blocks and function bodies, whose text only the
// server's procedural language parses, and a tautology hidden in an opaque expression (a
// function, CASE, COALESCE). The guards see no schema: an unqualified column is taken to be
// the target's, though in UPDATE ... FROM or DELETE ... USING it may be another table's, except
// inside a subquery with a FROM of its own, where it is taken to be that FROM's (PostgreSQL
// resolves it to the innermost table that has the column, which may be the subquery's): a
// subquery is correlated with the target through a qualified column, NOT EXISTS (SELECT 1 FROM
// u WHERE u.id = t.uid), not uid alone. Guards catch mistakes; to forbid a write, revoke the
// privilege.
//
// # Shared budgets
//
// With a coordination section every budget that does not say shared: false holds its
// server_share, burst_limit and max_concurrent across all the instances of the application:
// each instance enforces a lease of the budget that it renews through Redis every
// sync_interval, and falls back to an even split of the budget while Redis is unreachable.
// per_query_limit, warning_threshold and throttle_when stay per process. A budget with per
// shares each tag value's bucket and slots. See [Coordination].
//
// A shared budget with a quarantine shares it: each instance counts its own overruns, and a
// pattern one instance quarantines is refused by every instance within two sync intervals,
// until the quarantine ends (a budget with only max_duration or per_query_limit and a
// quarantine is shared for that alone). Redis holds only the fingerprint and the end, one
// hash per budget and quarantine settings (pgtraffic:{budget}:q:<after>:<for>), expiring with
// its last quarantine, at most 1,000 per budget; the status lists them with the instance that
// made them (the query text once this instance has met the pattern). A reload that changes
// the settings lifts them on the instance, which then shares under the new settings only: the
// quarantines made under the old ones lapse in Redis by themselves. While Redis is
// unreachable each instance goes on quarantining on its own.
//
// # Parsing
//
// [Parse] reads one YAML document (JSON is accepted as the YAML subset it is). Decoding is
// strict: unknown fields (with or without a value), duplicate keys, values of the wrong type,
// bad durations, bad CIDRs, out-of-range numbers (1e-400 too, which a float64 reads as 0) and
// rules naming unknown budgets are all errors, each naming the field path in rules-file
// spelling and the line it is on:
//
//	pgtraffic: rules line 7: budgets[1].max_concurent: unknown field (did you mean max_concurrent?)
//
// A list or mapping written with no value (budgets:) is omitted, as is any field written null
// (mode: null, or JSON's null). A field of one value written with none (mode:, max_concurrent:)
// is refused, as is a mode or explain written as an empty string (mode: "", require_where: ""),
// rather than read as the default: each is more often a template's unset variable than a
// choice, and would turn an enforce budget into a warn one, or a limit off, unseen. Leave the
// field out, or write null. An empty file, or one of only comments, is
// an error (a file caught half-written must not read as "no rules"): write {} for no rules. A
// file whose top level is not a mapping, or whose top-level keys are none of a rules file's
// (a password file, a .env file), is refused as not a rules file, without quoting it.
//
// Bytes that are not text (invalid UTF-8, NUL and other control characters), and in a file that
// starts with { or [ but that neither JSON nor YAML reads the JSON reader's first problem (a
// missing comma, text after the end of the document), are reported with their line, column and
// byte offset. (A file that starts with { or [ and is not JSON is read as YAML, whose flow style
// takes unquoted keys and a trailing comma.)
// Other syntax errors are the YAML parser's: some name the line where the list or mapping
// holding the problem begins, and say so. Every problem
// found is reported, joined with [errors.Join]; each is an [*Error], and errors.Is(err,
// [ErrInvalid]) holds for all of them. A message quotes at most 32 bytes of the file, and never
// a value that may hold a credential: nothing under coordination, no URL, no user@host, no
// key=value.
//
// Parsing and validation take time in proportion to the file: a budget and a rule per tenant,
// for a hundred thousand tenants, is an ordinary file. Generate such a file as JSON: it is read
// by a JSON reader with the same checks, messages and lines, many times faster than YAML. YAML
// aliases, which repeat a value without writing it out, keep to that: a file whose aliases stand
// for more than 10 times the values it holds (and more than 10,000) is refused, naming the line
// of the alias that crosses the bound.
//
// The driver reads a rules file only when it is a regular file (a symlink is followed) of at
// most [DefaultMaxFileSize] bytes unless the driver's WithMaxRulesFileSize says otherwise.
//
// # Configs built in code
//
// A [Config] built in code gets the same checks from [Config.Validate], with the same field
// paths and no line numbers. In code, a zero field means "omitted": no limit, or the default;
// the limits where zero blocks, [Budget.MaxConcurrent] and [Budget.ServerShare], are pointers,
// nil when omitted (MaxConcurrent: new(0) blocks), and so is [Budget.MaxQueue], where zero lets
// no statement wait and nil means the default. In a file an explicit zero is rejected where
// it would mean "no limit" (per_query_limit: 0s, max_duration: 0s, ...), because a reader could
// take it for "nothing allowed".
//
// # Defaults
//
// [Parse] returns a config with the defaults that follow from no other field filled in:
// server_cores 1, health_interval 1s, budget mode warn, explain auto, guard mode off; with a
// coordination section, sync_interval 1s and fallback_instances 10. The defaults that follow
// from other fields stay omitted, where they are read as the default: burst_limit (share × cores
// × 1s), max_queue (max_concurrent or 8, where max_wait is set; [Budget.QueueBound]) and, with
// a coordination section, shared (true; [Config.IsShared]). Made explicit, they would outlive a
// change in code to the fields they follow, and be taken for the file's: a parsed config whose
// coordination section a program removes for a run without Redis stays valid.
// [Config.WithDefaults] makes every default explicit, those included, to show what is in force.
// Validate never modifies its receiver.
package rules
