// Package engine is pgtraffic's decision core: for every statement it finds the pattern, merges
// the tags and matches the rule set, predicts the cost when a budget needs it, and admits, warns
// about or blocks the statement. It decides over one immutable compiled rule set at a time; the
// health sampler and the coordinator of shared budgets reach it through what it is handed
// (SetHealth, ShareQuarantines, AddQuarantines, and each budget's leases). Time comes from one
// injected clock ([Options.Now], [Options.After]). The layers point down:
//
//	driver (the front ends) → runtime (rules file, sampler, coordinator) → engine
//	engine → pattern, guard, ruleset, cost, budget, health
//
// It may import those packages (internal/pattern, internal/guard, internal/ruleset,
// internal/cost, internal/budget, internal/health), driver/rules and driver/rules/vocab,
// tagging, internal/bounded and internal/loglimit; it knows no front end, no database driver (a
// statement's connection is a [Conn], which EXPLAINs), no file watcher and no Redis client.
//
// # The path of one statement
//
// [Engine.Begin] takes the statement's text, its arguments and the connection it will run on
// (for EXPLAIN), and decides it in the caller's [Exec]; the front end sends the statement only
// if Begin admits it, and ends it with [Exec.Finish] and the outcome:
//
//	texts.go      text → pattern (pattern.Cache behind it), and the route cached per text
//	engine.go     Begin: built-in, comment and context tags merged when something reads them
//	decide.go     route (ruleset), guards, cost (cost.Model, EXPLAIN), health, admission; a
//	              pattern never seen has an unknown cost, reserved conservatively until it ends
//	admission.go  the one admission of statements, batches and Check: zero limits, health,
//	              quarantine and budgets, all-or-nothing, waiting in the budgets' queues
//	budget        all-or-nothing admission in the enforce budgets, each behind its own lock
//	blocks.go     a refusal recorded for the status; log.go: warn and block logs, rate-limited
//	engine.go     Finish: holds released, debt trued up (to the prediction on the server's
//	              clock, else to the time less the network's round trip), the cost model trained
//	serverclock.go what the server clock reader teaches: query identifiers, server means, the
//	              network's round trip (package serverclock reads them in the background)
//
// A front end's use of it, in full:
//
//	sctx, err := e.Begin(ctx, x, conn, sql, args) // sctx carries the observer's span
//	if err != nil {
//		return err // a *Denial (or ctx's error): send nothing, finish nothing
//	}
//	err = errPanicked // the outcome if the call below panics: any non-nil error
//	defer func() { x.Finish(sctx, err) }()
//	_, err = conn.Exec(ctx, sql, args...)
//
// The statement reads the rules in force as one immutable value, swapped atomically.
//
// # New rules
//
// [Engine.Compile] builds a Config's rule set without holding a lock and without changing what
// statements read; [Engine.Install] puts it in force: the budgets that keep their name keep
// their state, and take their new limits. Whoever installs serialises the Installs (the
// runtime does). snapshot.go and check.go read the budgets for the status and for batch jobs.
package engine
