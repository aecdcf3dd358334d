// Package coord makes a budget's limits hold across every instance of an application,
// through Redis, while each statement's decision stays local: "shared budgets".
//
// It may import internal/budget (whose leases it keeps in step; the budget knows nothing of it),
// driver/rules and driver/rules/vocab (the coordination settings and the reasons),
// internal/health (the Election it implements for the health sampler and the server clock
// reader), internal/bounded (a published reading's error text cut to its bound) and go-redis; nothing of the
// engine or the front ends.
//
// # Capacity leases
//
// Redis is the single source of truth and its TIME the only clock. For each shared budget,
// and each active partition of it (the value of its `per` tag; "" without one), every live
// instance holds a lease: a drain rate r_i (execution seconds per second), a burst b_i and a
// number of concurrency slots s_i. The instance's local budget enforces exactly its lease —
// its reverse leaky bucket drains at r_i with size b_i and at most s_i statements run — so
// the hot path never touches the network and has no second code path: a lease only changes
// the local budget's limits. This is YouTube Doorman's design (capacity leases renewed each
// interval, expiring when not renewed) rather than CockroachDB's token grants, because the
// local budget already is a rate limiter: a lease reconfigures it, where grants of tokens
// would need a second kind of bucket beside it.
//
// Once per sync interval (default 1s) a background loop per shared budget runs one Lua script
// (sync.lua; one call per 256 active partitions, going round them in the same order each time,
// two calls on their way at once). The budgets' loops take turns for at most eight calls on
// their way per connector (the client's connections), so that a budget never waits for the
// syncs of the others, only for a turn. The script
//
//   - applies the execution seconds the instance used since its last report to the
//     partition's GCRA "theoretical arrival time", so that global debt = rate × max(0, tat −
//     now) is known for status; a report counts once per sequence number, and an unanswered
//     report is resent unchanged, so a lost reply never counts usage twice. A report's
//     usage counts as run in the middle of the interval it covers (of its first interval
//     when failed syncs held it back), where the global bucket was idle since; while the
//     partition's lease is young (three intervals from the first), as run when the report
//     arrives (see "Cold start");
//   - drops the instances whose lease lapsed (leases last 2.5 intervals; see below);
//   - computes max-min fair (water-filling) targets over the live instances from their demand:
//     rate from offered execution seconds per second, slots from slots wanted. Rate and
//     slots nobody asked for are spread evenly as headroom, so a rise in demand is served
//     before the next sync (see "Slots with headroom"). Max-min rather than proportional:
//     demand counts refused statements, which a retry loop inflates, and proportional
//     shares would hand the budget to the most insistent instance; max-min gives each instance its demand or an even
//     split, whichever is smaller, so a 10:1 demand does not starve the small one.
//   - grants min(target, capacity − what the others hold), so that the grants in Redis never
//     sum above rate, burst (b_i = burst × r_i / rate) or max_concurrent: an instance whose
//     share shrinks gives back at its own next sync, and its slots count as held while its
//     earlier, larger limit may still have statements in flight;
//   - and returns the lease, the global debt, the live instances, the fair target and, to
//     an instance that wants more than it was granted, how long until another instance's
//     lease lapses.
//
// When slots do not divide evenly (max_concurrent below the number of instances, say) the
// odd slots go round the instances, ten intervals each: every ten intervals each instance
// draws a rank from its id and the epoch (rendezvous hashing) and the odd slots go to the
// first ranks. An instance that comes or goes moves only its own odd slot; a rotation by
// position would move most of them, idling each while it changes hands.
//
// All keys of a budget share one Redis Cluster hash tag, {budget@<digest>}: the budget's name
// and a digest of the database it limits (Options.Database), so that budgets of one name of
// different databases (shards, a primary and its standbys) share nothing. Its partitions are
// the fields of one hash, pgtraffic:{budget@<digest>}:p3 (see [PartitionsKey]), each a small binary value of fixed-size
// numbers with the tat and an entry per live instance, so that a call of 256 partitions reads
// them with one command and writes them with one, and the script decodes and encodes them
// without msgpack. A partition lapses a few intervals after its last
// instance left (or its debt drained). The calls sweep the hash and delete the lapsed fields,
// going round it about once every four intervals whatever the partitions they carry: each
// sweeps the fields due since the last sweep, a quarter of the hash per interval, paced by the
// time of the last sweep that the calls of every instance share, and at least a quarter as
// many as it carries partitions; at most 1,024 a call, so that a call stays short, and a
// budget left with a few active partitions among 100,000 lapsed ones deletes them within about
// a hundred of its calls. The hash expires with the last partition written, so idle partitions
// and dead instances cost bounded memory: 100,000 tenants cost 100,000 fields only while they
// are all active, and a few intervals more. The "3" is the key layout's version: the
// keys of earlier layouts (a msgpack value per field in pgtraffic:{budget}:p2, a key per
// partition in pgtraffic:{budget}:p:<partition>) are never read, so instances of different
// layouts do not see each other (see the changelog on upgrading).
//
// # Slots with headroom
//
// A max_concurrent lease is the instance's demand (the most statements that wanted a slot at
// once since its last sync, falling slowly) plus an even share of the slots no instance
// wants, the odd ones going round by rank as above. "Falling slowly": a rise counts at once,
// a fall halves the gap to the new peak each interval, and the estimate is reported rounded
// to the nearest slot, a half up, so a fraction below one half is no slot. A demand of N
// slots that stops is gone more than 1 + log2 N intervals later (one slot: at the second
// regular sync after the one that reported it; a quiet spell of an interval keeps half of
// it), and an idle instance then holds only its share of the headroom. The slow fall keeps a
// bursty instance's slots between its bursts while no other instance needs them; once another
// is kept short (a want message, below), a holder's estimate falls eight times as fast, halving
// the gap each eighth of an interval, so that slots held for a demand that stopped move within
// a few early syncs. (Not at once: a holder that dropped its estimate to its latest peak would
// give a bursty instance's slots away between its bursts, its next burst would be refused and
// call for them back, and a fleet well below the limit would sync eight times an interval.)
// Alone, an instance holds the whole
// budget: it refuses nothing that the same budget process-local would admit. With N
// instances, let D be the slots they wanted at their last syncs and d_i this instance's part
// of it: once the grants have settled, it holds d_i + (L − D)/N (rounded, for a limit L), so
// a statement is refused for want of a slot only when its instance's demand has grown by more
// than (L − D)/N since its last sync. When the instances grow alike, that is only at the
// limit; when one grows alone, the fleet then wants at least L − (N − 1)(L − D)/N slots (the
// others' demand, its own and its headroom): it is within N − 1 shares of the headroom of the
// limit, each share less than the growth that instance made within one sync.
// The others hand it their headroom at once: a starved instance syncs early (an eighth of an
// interval after its last) until it holds its target; when it wants more than its grant, or
// than the limit it applied (it was refused since its last sync), and is kept below its target
// by another instance holding slots beyond its own target, the sync script says so on the
// budget's want channel (pgtraffic:{budget@<digest>}:want, the message being the partition's field),
// every coordinator listens on those channels, and each holder of slots in that partition, the
// sender included, syncs early (an eighth of an interval after its last at the soonest), its
// estimate falling fast as above, and Redis computes what it hands back; an instance that
// gives slots back while another holds less than its target confirms at once that it applied
// its smaller limit (Redis counts its larger one as held until it reports), and the sender,
// syncing again, takes them. Without the message (Redis pub/sub unreachable, a message lost)
// the holders hand them over at their next regular syncs, and a demand that stopped over the
// estimate's slow fall. A message is untrusted input: at most it brings an early sync of a
// partition the instance holds, spaced as any early sync, and a faster fall of its estimate.
// Each instance holding slots of the partition syncs once per message, whether or not it
// holds beyond its target (it cannot know its new target before Redis computes it), so a
// shortfall costs up to one early call per instance of the partition per eighth of an
// interval, and messages go out only while some instance holds more than its target: they
// stop once the holders have handed over. A saturated partition (every instance wanting more
// than it holds, each at its target) sends none, and a fleet below the limit with bursty
// instances few, no more than before the faster fall (integration/PERFORMANCE.md). An
// instance joining holders of the whole budget is served the same way: its first grant is
// what the others do not hold (none, when one holds the whole budget), and it is refused for
// want of a slot until the holders' early syncs and its own next one, about a quarter of an
// interval.
//
// The bound above takes d_i as the instance reports it: the most statements in flight plus
// those refused for want of a slot between two visits of its coordinator, which a refusal
// brings at once. So an instance whose refused statements retry without waiting (max_wait)
// reports a rise of demand a step at a time. When load moves from one instance to another,
// the first steps bring the messages, the estimate of the instance whose load stopped falls
// fast, and the rising one's early syncs take the slots it gives back: it is refused for two
// to five early syncs from its first refusal, where the slow fall alone took about an interval
// (integration/PERFORMANCE.md has the figures). Where the instances all want more than the
// limit, the steps set the pace at which the fair split is reached: a slot or a few per early
// sync. A statement that waits (max_wait) counts at every report until it is admitted, so
// waiting statements report their demand whole.
// The sum of the grants in Redis never exceeds L: a grant is at most what the others do not
// hold (a provisional lease is no grant; see "Provisional leases" for what it may add).
//
// A budget without a per tag has one partition, "", which is leased when the budget is
// registered (before its first statement) and kept while it is, idle or not: one call per
// interval even while idle, so that a burst after a quiet spell finds its headroom. Keyed
// partitions come and go with their values: a partition idle for three syncs (nothing in
// flight, nothing waiting) is left (see "What the local budget must offer"), and comes back
// on a provisional lease.
//
// # Provisional leases
//
// A partition this instance holds no grant for (a value new to it, or back after a quiet
// spell) runs on a provisional lease until its first grant, with no call on the statement's
// path: what Redis would grant it were no instance asking for any of the partition, the
// budget divided by the instances last seen sharing it (the most live in one partition at
// the last regular sync; fallback_instances before any sync answered), at least one slot,
// with at most the burst of a first interval (see "Cold start"), and no burst before any
// sync answered or while syncs fail. Its first statement kicks the coordinator, and the
// partition is leased at an early sync a tenth of an interval (at most 100ms) after the last
// (after the sync under way, when a long one of many partitions is).
//
// Alone, an instance's provisional lease is the whole budget's slots and rate: one instance
// refuses nothing for concurrency that the same budget process-local would admit, a quiet
// tenant included. With N instances, a new partition's share of slots is its share of the
// headroom when nobody asks for any (⌊L/N⌋ of a limit L), so the guarantee of "Slots with
// headroom" holds for it too: its statements are refused for want of a slot only once they
// outgrow that share before the first grant.
//
// The bound it costs: Redis counts nothing of a provisional lease until the sync that
// reports the partition answers; from then on it counts the instance as holding the
// provisional slots, or its statements in flight if more, until it applies a smaller grant,
// and grants the others only what is left. So the statements in flight of one partition,
// across the fleet, exceed max_concurrent by at most the provisional slots of the instances
// that met it within that window while other instances held its slots (each ⌊L/N⌋: less
// than L together), and for at most about an interval (until the holders' next syncs hand
// back what Redis now counts, or those statements end). Instances that meet a partition no
// one held take at most L together (⌊L/N⌋ each; one each when L < N). A provisional rate and
// burst are bounded alike, and what they ran reaches the global bucket as usage, whose debt
// the instances' leases then carry. A budget that becomes shared while it runs (a reload
// adding a coordination section) keeps its own limits on the partitions it holds until their
// first grants, a round trip later: it ran them unseen by the others until then anyway, and
// its statements in flight are counted from its first report.
//
// # Lease duration
//
// A lease lasts 2.5 intervals from the sync that granted it. Renewals come every interval, so
// one missed or failed renewal does not lapse it, while a crashed instance's capacity
// returns within 3 intervals: Redis tells each instance that wants more when the first other
// lease lapses, and that instance syncs at that moment, rather than at
// its next regular sync, to take the capacity up. A live holder renews long before its lease
// would lapse, after the starved instances' regular syncs, so this costs no call in a steady
// state. The holder counts its lease from the moment it sent the sync, before Redis's clock
// started it, so it always stops using a lease before Redis hands it to another instance. A
// shorter lease would lapse on one late sync; a longer one keeps a crashed instance's slots
// idle longer.
//
// # When to sync
//
// Regularly once per interval, on a grid whose phase each instance draws at random at its first
// sync and after a failure, so that instances started or recovered together do not sync
// together (or once per sync's length, when a sync of many partitions takes longer); at the
// moment another instance's lease lapses for a partition that wants more than it holds (see
// above). Earlier when the local budget kicks ([Handle.Kick]: it refused or made wait a
// statement, or admitted one on a provisional lease): a tenth of an interval (at most 100ms)
// after the last sync for a partition with no lease yet, an eighth of an interval (at most 125ms) for a
// starved partition below its fair target, or wanting more slots at once than its last sync
// reported while it holds fewer than max_concurrent (a burst on an instance with room). A
// starved partition at the fair share of the demand Redis knows does not sync early: there is
// nothing to gain. An early sync carries only the partitions that asked for it (new, starved
// below their share, waiting for a lapse, or confirming a smaller grant): a budget of a hundred
// thousand tenants does not sync them all each time one of them appears. Each script call of a
// sync (one per 256 partitions) is bounded by a deadline of a quarter interval (at least
// 100ms), so that a budget with tens of thousands of active partitions syncs against a healthy
// Redis; a call that overruns it is abandoned even if the client ignores contexts. After a
// failed sync the next one's deadline doubles, up to four times the first, until a sync
// succeeds, and a coordinator's syncs have that longest deadline until its first succeeds: a
// call after a failure, and a fresh instance's first call, run on a new connection, whose
// handshake takes round trips of its own within the deadline, and a Redis more than a third of
// a deadline away would otherwise fail every fresh instance's first call and never be synced
// with again after one failure. A sync keeps
// two calls on their way, so that Redis has the next one to run while the client applies a
// reply, and hands each reply's leases to the local budget as it applies it; an abandoned call
// holds its place among the instance's eight until it returns, and a call that finds no place
// within its deadline fails (errNoTurn). A regular
// sync whose last one was busy for more than two fifths of the interval (tens of thousands of
// partitions) spreads its calls evenly over four fifths of it, so that each partition is
// renewed at the same offset into every sync, an interval after the last, however fast Redis
// answers this time; sent as fast as Redis answers, a partition late in a slow sync that
// follows a fast one would wait an interval plus the difference. A shorter sync is not spread:
// the early syncs of every budget wait for the sync under way.
//
// # Failures
//
//   - Redis slow or down: the instance keeps its lease until it lapses (2.5 intervals after
//     the sync that granted it, measured from the send, so before Redis lapses it), then
//     uses the budget divided by the instances last seen in the partition: at once if its lease was
//     larger (Redis no longer counts it), rising towards it, halving the gap each interval, if
//     smaller. Every instance converges on the same share, so the sum stays within the budget.
//     Slots divide rounding down, but an instance keeps at least one slot, because an internal
//     failure must not stop every statement of a budget: with more instances than
//     max_concurrent, an outage may let one statement per instance run.
//   - An instance cut off from Redis while the others are not (or too slow to sync for a
//     lease duration) keeps its fallback share while Redis hands its lease to the others: the
//     aggregate may exceed the budget by that share until it is back. Leases without fencing
//     cannot do better without making an outage stop the budget's statements.
//   - Retries come after a random 0.5–1.5 intervals, so instances do not return to a
//     recovered Redis all at once; no early syncs while failing. The first retry comes
//     early enough to renew a lease in force before it lapses: one failed sync must not
//     lapse a lease (a lapsed lease gives way to the fallback share, which Redis does not
//     count, and which with more instances than max_concurrent may hold a slot the lease
//     did not).
//   - A hung Redis replays its socket when it resumes. Each call carries a deadline in
//     Redis's own time (its clock at the last reply, advanced by ours since, plus twice the
//     sync deadline); Redis ignores a call it runs later.
//   - Redis unreachable at start: the connector opens, one line is logged, partitions run on
//     their provisional lease, the budget's rate divided by
//     [rules.DefaultFallbackInstances] (10, configurable) —
//     never the whole budget, which would be the safe choice for one instance only — with
//     no burst room (a statement once the last one's cost has drained): instances that start
//     together each with a fresh bucket would otherwise add their bursts up. The loop keeps
//     trying.
//   - Lost instances. An instance whose entry Redis dropped may still run on its fallback
//     share: Redis lost its memory (restart, failover), or the entry lapsed while nobody could
//     sync (Redis hung). The script tells these from a crash by the partition itself: the hash
//     is gone though the caller saw other instances lately (or at any time while it was
//     failing), or nobody synced the partition for two intervals, or the caller itself comes
//     back from failed syncs (an outage too short for the partition to go unsynced for two
//     intervals still lapses the leases of instances waiting for their retries, which
//     are spread over up to 1.5 intervals). Then for one lease duration it keeps the even
//     share of the instances that were there and are not back free for them. An instance
//     that lapses while others sync normally has crashed: its slots return exactly when
//     its lease lapses. What remains possible after a restart:
//     leases granted before it that exceed the even share run beside the new ones until their
//     holders resync (within 1.5 intervals): with uneven demand, about one extra burst. An
//     instance that leaves (Close) is recorded as gone, so others need not wait for it.
//   - A partition's hash gone (a restart, or a hang that outlasted its expiry: a hash
//     expires two lease durations after its last sync, 5 s at the default interval): the
//     hash made anew counts as idle for as long as a report's usage may count back, so that
//     the usage the instances ran on their fallback shares meanwhile fills that time, as
//     when the hash survives, rather than becoming debt at once.
//   - Redis holds something the script did not write (another writer, a corrupted
//     restore): every number read back is checked, in the script and again in Go. A
//     non-finite or negative value, an entry cut short or that expires beyond a lease
//     duration from now, is ignored and overwritten; a lease is bounded by the budget's own
//     limits before the local budget uses it, and the local budget bounds it again.
//   - Instances disagree on the limits (a change of the rules half rolled out): each entry
//     records its instance's limits, and every instance divides the smallest limits among
//     the live entries, so that together they hold the smaller limit and each keeps its
//     even share of it. [Status] shows it (LimitsDiffer, LimitsInForce) until they agree.
//
// The coordinator logs through [Options].Logger: one line when Redis becomes unreachable and
// one when it is back. go-redis logs some failures of its own ("failed to dial") through its
// package logger, which only redis.SetLogger sets, for the whole process: a library must not
// change that for the application, so pgtraffic leaves it alone, and an application that
// wants those lines elsewhere (or nowhere) calls redis.SetLogger itself.
//
// # What the local budget must offer
//
// The budget package implements [Local] for each shared budget:
//
//   - Per partition, limits that can be set while keeping state: SetLease(now, key, lease)
//     sets that partition's drain rate, bucket size and max_concurrent, keeping its debt
//     (drained at the old rate until now) and its in-flight count, as Budget.SetSpec does for
//     the whole budget today — but forgiving a debt above the new burst down to it, by at
//     most the burst the lease lost: a debt run up under a larger lease, kept whole, would
//     shut the partition out for debt ÷ rate, long after the global bucket drained it (a
//     first instance that took the whole burst alone would wait burst ÷ (rate ÷ instances)),
//     while a debt that one statement larger than the lease's burst ran up (see below) stays
//     owed. The cap forgives at most the burst that moved, so a shift in demand may let about
//     one extra burst through. A lease of zero rate means no credit, zero slots no slot (not
//     "unlimited" as in a Spec). A partition with credit and no debt admits one statement
//     whose cost exceeds its lease's burst (but not the budget's), else a small lease could
//     never admit a large statement.
//
//   - A provisional lease: SetProvisional(owner, lease) sets the limits of each partition
//     the budget meets without a lease (new to it, or dropped), which it enforces until
//     SetLease; the partitions it holds when it becomes shared (SetShared) keep its own
//     limits until then. It kicks the coordinator when it admits a statement on such a
//     lease, and its usage says so (Usage.Provisional), so that a partition it evicted
//     while the coordinator still holds a grant for it is handed that grant again.
//
//   - Its share of the global debt: a lease carries Debt, the global debt at the grant times
//     the lease's share of the rate (at most the lease's burst), and SetLease raises the
//     partition's debt to at least that (see "Cold start").
//
//   - Counters per partition, reset by TakeUsage: offered execution seconds (predicted cost
//     of admitted and refused statements), used execution seconds (actual, at release), the
//     peak number of statements that wanted a slot at once (in flight plus every statement
//     refused or waiting for a slot since the last report: a statement still waiting under
//     max_wait counts at every report until it is admitted or leaves), the current in-flight
//     and waiting counts, and whether any statement starved (one still waiting did). Only the
//     partitions with something to report are returned; the coordinator keeps reporting a
//     partition for two more syncs after it went idle (nothing in flight or waiting), then
//     leaves it and calls DropLease (the budget forgets it once idle with no debt and no
//     statement waiting, and holds it to the provisional lease until then). A zero lease is
//     a grant of nothing, not a drop.
//
//   - A kick when it refuses or delays a statement for want of credit or slots, or creates a
//     partition: [Handle.Kick], a non-blocking flag and channel send.
//
//   - Statements waiting for capacity (max_wait) must be woken by SetLease and DropLease as
//     by a release: a larger lease is capacity, and so may be the provisional lease (or an
//     absent key's) that a drop puts in its place.
//
// # Cold start
//
// Instances that start together reach Redis one after the other, and their first statements
// show no demand (the cost model predicts a pattern it has never seen run at about nothing):
// the first instance to sync, alone or alone asking for much, is granted the whole burst and
// can use it before the others arrive. Then the burst moves: its lease shrinks and its local
// debt is forgiven down to its new burst (see above), while the others' new leases would come
// with empty buckets, though the global bucket in Redis did count what it used. Two rules
// keep a cold start within one burst:
//
//   - For its first interval in a partition, an instance's lease has at most the burst of
//     the instances assumed before any were seen (budget ÷ fallback instances): a lone
//     instance waits one interval for its full burst, but instances that start together do
//     not each take the whole of it in turn.
//   - A lease carries its share of the global debt that no live instance's bucket holds,
//     and the local bucket holds at least its own debt and that share from then on:
//     together the instances' buckets offer no more room than the global bucket has. Each
//     sync reports the local bucket's debt; Redis counts each instance's as reported,
//     drained since at its lease's rate, and at most its lease's burst (a lease that
//     shrank forgave the rest). In a steady state the local debts hold the global debt and
//     nothing changes; an instance joining a budget whose debt another's shrunken lease
//     forgave, or that instances which left or crashed ran up, waits for its share of it to
//     drain. Only that share: a share of the whole global debt would fill each bucket with
//     the instance's own usage a second time (the global bucket counts it when the report
//     comes, after the local one did), and statements costing about a lease's burst would
//     wait for their own cost twice, holding the budget below its rate. The share is capped
//     at the burst: a debt past it would stop every instance for longer than a burst takes
//     to drain.
//
// Usage that reaches Redis late is not such a debt. During an outage every instance runs on
// its lease, then on its even share, and reports what it ran when Redis is back; counted as
// run at that moment, it would land in the global bucket at once, and its shares would fill
// every instance's bucket until it drained, at the little rate the instances then leave
// unused: for tens of seconds the budget would admit below its rate. So a report says how
// long ago its usage counts as run: in the middle of the interval it covers, or, held back
// by failed syncs, in the middle of its first interval, as if it had come on time (while a
// partition's lease is young, the first three intervals, at the end of that interval: a cold
// start's usage is exactly the debt that must not be offered again). Its usage
// fills the time the global bucket was idle since, and only what does not fit is debt;
// where others kept the bucket busy meanwhile (an instance cut off alone), the late usage
// is debt in full.
//
// The engine adds the other half: a statement of a pattern never seen to run reserves a
// conservative share of the burst until it ends (see package engine).
//
// # Shared quarantines
//
// A budget with a quarantine ([Spec].Quarantine) shares it in the same script call as its
// leases: the first call of each sync publishes the quarantines this instance began since the
// last one ([Handle.Quarantine], which asks for an early sync, a tenth of an interval after the
// last) and returns every quarantine of the budget in force, handed to [Options].Quarantines.
// Another instance thus refuses the pattern after its next regular sync: within two intervals.
// A budget with nothing to lease but a quarantine is registered without a [Local] and syncs
// every interval for its quarantines alone. Redis holds one hash per budget and settings
// ([QuarantineKey]): fingerprint → end in Redis's clock, pruned by every call and expiring with
// its last quarantine, at most [MaxQuarantines] fields; times cross Redis as durations left, so
// the instances' clocks need not agree. Every field read back is checked by the script (not a
// fingerprint, not a finite number, ended: deleted; ending past for: from now: cut to it) and
// again in Go (ignored and counted in [Status].Ignored). Settings in the key mean a reload
// that changes them starts from an empty hash. See quarantine.go.
//
// Status ([Coordinator.Status]) reports, per budget, the leases in force, the global debt and
// the instances as last seen, and the sync counters for metrics.
//
// # Wiring into a connector
//
// When the rules have a coordination section, the connector makes one [Coordinator] with the
// client given by driver.WithRedisClient or else [Options].URL, the section's URL, the
// section's sync interval and fallback instances, and starts it. Each budget that
// rules.Config.IsShared reports as shared is registered with [Coordinator.Register], its
// [Spec] being the budget's rate (server_share × server_cores), burst_limit and
// max_concurrent, and its [Local] the budget itself; the budget keeps the [Handle] to kick it.
// A shared budget with a quarantine is registered too, with no Local if it has none of those
// limits; the engine's table of quarantines hands its new quarantines to the Handle and is
// the coordinator's [Options].Quarantines.
// A reload calls [Handle.SetSpec] for a changed budget, [Handle.Close] for one removed or no
// longer shared, and Register for a new one. Connector.Close calls [Coordinator.Close] with a
// short deadline. A reload that changes the coordination section registers the budgets with a
// new coordinator under the same instance id, and starts it only once the old one closed into
// it ([Coordinator.CloseInto]): never are two coordinators of one id live at once. Each budget
// registered with both goes on in the new one as it was (its leases and their expiries, its
// reports still pending, the instances it saw), under the new settings, and says no goodbye:
// to Redis the instance never left, and the new coordinator's first sync renews entries that
// are its own. A new id would need the old one's goodbye before its first sync, and a goodbye
// that Redis does not answer within the deadline leaves the old id's slots counted until its
// leases lapse: a lone instance would be granted only what they leave, none. A new
// coordinator starting from nothing would put its budgets on the provisional lease (the
// budget over fallback_instances) when its first sync fails, where one failed sync otherwise
// keeps the leases in force. Updating the coordinator in place would do only for the settings
// that need no new Redis client, and a new URL may name the same Redis. Carried over, the
// leases in force are those Redis counts for the id, so the fleet's grants never sum above
// the limit; the new client may reach another Redis, so Redis's clock is not carried (the
// first call has no deadline in Redis's time, as any coordinator's first call). The budgets
// the new coordinator does not share say goodbye as at Close; since the id stays, a goodbye
// that Redis runs late could find the budget shared again by a later coordinator and synced
// under the same id, so every coordinator numbers its reports above those of the one it
// replaced, and the script ignores a goodbye older than the entry it finds. Nothing of this
// runs on a statement's path.
package coord
