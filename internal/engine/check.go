package engine

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/budget"
	"github.com/pgtraffic/pgtraffic/internal/health"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/internal/ruleset"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// checkPattern stands for "the job's next statement" in Check's denials.
var checkPattern = &pattern.Pattern{Fingerprint: "", Kind: "other"}

// nominalCost is the cost Check asks the buckets for: one small statement (1 ms). A batch job
// that checks before a chunk wants to know whether its next statement would be admitted.
const nominalCost = 0.001

// Check reports whether a statement carrying ctx's tags would be admitted now by the enforce
// budgets its tags select: health thresholds, concurrency and bucket room. It takes nothing.
// It returns nil or a *Denial.
func (e *Engine) Check(ctx context.Context) error {
	st := e.state.Load()
	if st.rules == nil {
		return nil
	}
	var tagBuf [12]ruleset.KV
	tags := tagBuf[:0]
	ctxTags := tagging.From(ctx)
	for _, kv := range e.builtins {
		if _, ok := ctxTags.Get(kv.Key); !ok {
			tags = append(tags, kv)
		}
	}
	for k, v := range ctxTags.All() {
		tags = append(tags, ruleset.KV{Key: k, Value: v})
	}
	var ruleBuf [8]int
	// Start is the time health is judged at: a zero Start would make every sample look fresh.
	now := e.now()
	x := &Exec{e: e, Pattern: checkPattern, Tags: tags, at: e.clock(now), timed: true}
	for _, r := range st.rules.Match(tags, ruleBuf[:0]) {
		bs := st.budgets[st.ruleBudget[r]]
		if bs.mode != modeEnforce {
			continue
		}
		if d := e.healthDenial(st, bs, r, x); d != nil {
			return d
		}
		key := ""
		if bs.per != "" {
			key, _ = tagValue(tags, bs.per)
		}
		req := [1]budget.Request{{Budget: bs.b, Key: key, Cost: nominalCost}}
		if den := budget.Check(now, req[:]); den != nil && den.Reason != ReasonPerQuery {
			return &Denial{Budget: bs.name, Rule: st.ruleName[r], Reason: den.Reason, Limit: den.Limit, RetryAfter: den.RetryAfter}
		}
	}
	return nil
}

// Wait blocks until Check passes or ctx ends (then it returns ctx's error). Between checks it
// sleeps about the denial's retry hint with jitter, growing with each attempt, so that many
// waiting jobs do not all rush in the moment a metric drops.
func (e *Engine) Wait(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		err := e.Check(ctx)
		if err == nil {
			return nil
		}
		base := e.state.Load().healthInterval
		if d, ok := err.(*Denial); ok && d.RetryAfter > 0 && d.RetryAfter < base {
			base = d.RetryAfter
		}
		t := time.NewTimer(health.Backoff(attempt, base, rand.Float64()))
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}
