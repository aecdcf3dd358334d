// Package cost predicts how many execution seconds a statement will cost before it is sent,
// from the planner cost an EXPLAIN gave (package pgxexplain runs it on the statement's own
// connection) and from what the pattern's executions took.
//
// It imports the standard library only: no database driver.
//
// Only statements that match a budget needing a cost come here (design step 5); everything else
// takes the fast path and never touches this package.
//
// # The model
//
// PostgreSQL's planner cost is dimensionless but roughly linear in work. [Model] learns, for each
// pattern (fingerprint), the factor k that turns planner cost into seconds on this server: the
// ratio of an exponential moving average (EMA) of actual execution seconds to an EMA of planner
// cost over the same executions. A prediction is planner cost × k.
//
// One pattern's k is not one number, though: an index scan of ten rows and a sequential scan of a
// hundred thousand rows of the same pattern (a range whose width comes from the arguments) cost
// differently per planner unit. So each pattern also keeps, for up to 8 power-of-two ranges of
// planner cost, the last 5 per-execution ratios actual / planner cost, and a prediction uses the
// median of the ratios of its own range (else of the adjacent range above or below), falling back
// to the EMA ratio. The median, not a mean, because on a loaded server one slow execution would
// drag a mean for many executions (the accuracy benchmark's figures are in
// integration/PERFORMANCE.md). A pattern never seen with a plan cost uses a global k learned from
// the executions of every pattern whose plan is large enough for its time to be the plan's (a
// thousand units or more: a tiny plan's time is the statement's fixed cost), with
// [DefaultGlobalK], measured on PostgreSQL's default cost units, standing in for the first ten
// such executions not yet seen (before any, it alone), so that one slow early statement (a
// lock wait) does not price every new pattern. Every average here is the plain mean of its
// first 1/α samples before it moves by α, for the same reason. With no plan cost at all
// (EXPLAIN skipped or failed), the prediction falls back to the pattern's mean actual time.
// Cancelled and failed executions must not be observed: their durations say nothing about cost.
//
// EMA weights, and why:
//   - per pattern α = 0.2: about the last ten executions. k drifts as tables grow and plans
//     change, so recent executions should dominate (as in PlanetScale's Traffic Control), yet one
//     slow outlier moves the mean by only a fifth of its excess.
//   - global k α = 0.01: about the last 200 executions. It is a prior for unseen patterns and
//     should describe the workload, not the last statement. It is a ratio of averages, so
//     expensive statements dominate it; an average of per-pattern ratios would let cheap
//     statements, whose fixed overhead makes k large, inflate every new expensive prediction into
//     a false block.
//   - EXPLAIN round trip α = 0.1: about twenty round trips.
//
// The first sample seeds each average, so a new pattern is not under-predicted while an EMA
// climbs from zero. The pattern table is bounded ([NewModel]'s maxPatterns); training or
// explaining a new pattern in a full table evicts the one least recently trained or explained.
//
// # When to EXPLAIN
//
// Planner cost depends on the arguments as well as the pattern. The model keeps each pattern's
// last plan cost for [PlanTTLOf] ([Model.PutPlan]), and [Model.Predict] uses it for an execution
// that is not explained itself: explain mode pattern always, mode call only when its own EXPLAIN
// fails, and mode auto unless [Prediction.Volatile] reports that the pattern's actual cost
// varies widely (coefficient of variation above 0.5) and its mean cost exceeds 10 EXPLAIN round
// trips, where an EXPLAIN per call is cheap insurance. Until then its executions were priced by
// one cached plan cost, another execution's: when a pattern so trained turns volatile its plan
// history (its k) starts anew, so that a call is not priced by a k learned from the plan of
// other arguments ([Model.Observe] is told whether a plan cost was the execution's own). One
// call to Predict answers the cached plan cost, the prediction and the volatility check
// together, under one lock, without allocating.
package cost
