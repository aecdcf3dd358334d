package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Each round runs every arm once, and the order rotates, so that no arm always runs first or
// after the same arm.
func TestSchedule(t *testing.T) {
	var arms []armSpec
	for _, name := range armNames {
		arms = append(arms, armSpec{name: name})
	}
	const rounds = 4
	got := schedule(arms, rounds)
	if len(got) != rounds*len(arms) {
		t.Fatalf("%d runs, want %d", len(got), rounds*len(arms))
	}
	firsts := map[string]bool{}
	for r := range rounds {
		round := got[r*len(arms) : (r+1)*len(arms)]
		seen := map[string]bool{}
		for _, a := range round {
			if a.round != r+1 {
				t.Errorf("run %s of round %d says round %d", a.name, r+1, a.round)
			}
			if seen[a.name] {
				t.Errorf("round %d runs %s twice", r+1, a.name)
			}
			seen[a.name] = true
		}
		if len(seen) != len(arms) {
			t.Errorf("round %d runs %d arms, want %d", r+1, len(seen), len(arms))
		}
		firsts[round[0].name] = true
	}
	if len(firsts) != rounds {
		t.Errorf("first arms of the rounds: %v; want a different one each round", firsts)
	}
}

// fakeArm builds an arm's result whose checkout p99 is p99 (100 samples) and whose reports
// completed done.
func fakeArm(name string, p99 time.Duration, done int64) *armResult {
	p := &armResult{name: name, measured: time.Second, noiseDone: done}
	for i := range 100 {
		lat := time.Millisecond
		if i >= 98 {
			lat = p99
		}
		p.critical = append(p.critical, sample{latency: lat})
	}
	return p
}

// The verdict of the cure compares the arms whose reports complete work: an arm whose reports
// all fail cannot win by doing nothing.
func TestBest(t *testing.T) {
	for _, tc := range []struct {
		name string
		arms []*armResult
		want string
	}{
		{"pgtraffic lowest", []*armResult{
			fakeArm(armSolo, 1*time.Millisecond, 0),
			fakeArm(armUncontrolled, 9*time.Millisecond, 100),
			fakeArm(armOneConn, 3*time.Millisecond, 20),
			fakeArm(armTimeout, 8*time.Millisecond, 50),
			fakeArm(armPgtraffic, 2*time.Millisecond, 10),
		}, armPgtraffic},
		{"one-conn lowest", []*armResult{
			fakeArm(armSolo, 1*time.Millisecond, 0),
			fakeArm(armOneConn, 2*time.Millisecond, 20),
			fakeArm(armPgtraffic, 3*time.Millisecond, 10),
		}, armOneConn},
		{"an arm that completes nothing does not count", []*armResult{
			fakeArm(armSolo, 1*time.Millisecond, 0),
			fakeArm(armTimeout, 1*time.Millisecond, 0),
			fakeArm(armPgtraffic, 2*time.Millisecond, 10),
		}, armPgtraffic},
		{"no arm completes anything", []*armResult{
			fakeArm(armSolo, 1*time.Millisecond, 0),
			fakeArm(armPgtraffic, 2*time.Millisecond, 0),
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &results{runs: tc.arms}
			got := ""
			if b := r.best(); b != nil {
				got = b.name
			}
			if got != tc.want {
				t.Errorf("best = %q, want %q", got, tc.want)
			}
		})
	}
}

// Runs of one arm merge: their samples, counts and measured time add up.
func TestResultsArmMerges(t *testing.T) {
	a, b := fakeArm(armTimeout, time.Millisecond, 2), fakeArm(armTimeout, time.Millisecond, 3)
	a.noiseTimedOut, b.noiseTimedOut = 1, 4
	a.noiseBusy, b.noiseBusy = time.Second, 3*time.Second
	r := &results{runs: []*armResult{a, fakeArm(armSolo, time.Millisecond, 0), b}}
	m := r.arm(armTimeout)
	if m.noiseDone != 5 || m.noiseTimedOut != 5 || len(m.critical) != 200 || m.measured != 2*time.Second {
		t.Errorf("merged: done %d, timed out %d, %d samples, measured %v; want 5, 5, 200, 2s",
			m.noiseDone, m.noiseTimedOut, len(m.critical), m.measured)
	}
	if got := m.stats().load; got != 2 {
		t.Errorf("load = %v, want 2 (4 s of reports in 2 s)", got)
	}
	if r.arm(armPgtraffic) != nil {
		t.Error("an arm that never ran merged into a result")
	}
}

func TestIsQueryCanceled(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "57014"}), true},
		{&pgconn.PgError{Code: "53000"}, false},
		{context.Canceled, false},
		{errors.New("57014"), false},
		{nil, false},
	} {
		if got := isQueryCanceled(tc.err); got != tc.want {
			t.Errorf("isQueryCanceled(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func TestWithRuntimeParam(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u@h:5432/db?sslmode=disable", "postgres://u@h:5432/db?options=-c%20a%3D0&sslmode=disable"},
		{"host=h user=u", `host=h user=u options='-c a=0'`},
	} {
		got, err := withRuntimeParam(tc.dsn, "options", "-c a=0")
		if err != nil || got != tc.want {
			t.Errorf("withRuntimeParam(%q) = %q, %v; want %q", tc.dsn, got, err, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	good := flags{phase: time.Second, rounds: 1, workers: 1, noise: 1, orders: 1000, accounts: 1000,
		window: time.Second, out: "x.png", maxConcurrent: 1, perQuery: time.Second, share: 0.1, burst: time.Second,
		maxWait: time.Second}
	if err := good.validate(); err != nil {
		t.Fatalf("good flags: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(*flags)
		want string
	}{
		{"rounds", func(f *flags) { f.rounds = 0 }, "-rounds"},
		{"per-query below a millisecond", func(f *flags) { f.perQuery = time.Microsecond }, "-per-query"},
		{"per-query not whole milliseconds", func(f *flags) { f.perQuery = 1500 * time.Microsecond }, "-per-query"},
		{"share", func(f *flags) { f.share = 0 }, "-share"},
		{"max-wait", func(f *flags) { f.maxWait = -time.Second }, "-max-wait"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := good
			tc.edit(&f)
			if err := f.validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("validate() = %v, want an error naming %s", err, tc.want)
			}
		})
	}
}

// The whole experiment, small, against a real PostgreSQL: every arm runs and does what it stands
// for. Uncontrolled runs several reports at once and completes them; the one connection of
// one-conn runs one at a time and completes them; a statement_timeout of -per-query (here far
// below a report's run time) cancels the timeout arm's reports; the budget, whose
// per_query_limit is the same, refuses the pgtraffic arm's. Each arm runs until it has shown
// this (untilShown), with a minute as the limit, so that a loaded machine takes longer rather
// than fails; on a quiet one each arm takes a fraction of a second.
func TestRunEveryArm(t *testing.T) {
	out := filepath.Join(t.TempDir(), "nn.png")
	f := flags{phase: time.Minute, rounds: 1, settle: 0, workers: 2, noise: 4,
		orders: 100_000, accounts: 10_000, window: 500 * time.Millisecond, out: out,
		maxConcurrent: 1, perQuery: 5 * time.Millisecond, share: 0.15, burst: 2 * time.Second,
		maxWait: 2 * time.Second, untilShown: true}
	var buf bytes.Buffer
	res, err := run(context.Background(), f, &buf)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, buf.String())
	}
	t.Log(buf.String())
	for _, name := range armNames {
		p := res.arm(name)
		if p == nil {
			t.Fatalf("arm %s did not run", name)
		}
		if len(p.critical) == 0 {
			t.Errorf("arm %s: no checkout statement measured", name)
		}
		if !tableHasRow(buf.String(), name) {
			t.Errorf("the table has no row for %s", name)
		}
	}
	if p := res.arm(armSolo); p.noiseBusy != 0 || p.noisePeak != 0 {
		t.Errorf("solo ran reports for %v on %d connections", p.noiseBusy, p.noisePeak)
	}
	if p := res.arm(armUncontrolled); p.noiseDone == 0 || p.noisePeak < 2 {
		t.Errorf("uncontrolled: %d reports done, at most %d connections held; want some done, several held at once", p.noiseDone, p.noisePeak)
	}
	if p := res.arm(armOneConn); p.noiseDone == 0 || p.noisePeak != 1 {
		t.Errorf("one-conn: %d reports done, at most %d connections held; want some done, one connection", p.noiseDone, p.noisePeak)
	}
	if p := res.arm(armTimeout); p.noiseTimedOut == 0 || p.noiseDone != 0 {
		t.Errorf("timeout: %d reports timed out, %d done; want every report cancelled by a 5ms statement_timeout", p.noiseTimedOut, p.noiseDone)
	}
	if p := res.arm(armPgtraffic); p.noiseRefused == 0 || p.noiseDone != 0 {
		t.Errorf("pgtraffic: %d reports refused, %d done; want every report refused by a per_query_limit of 5ms", p.noiseRefused, p.noiseDone)
	}
	if _, err := os.Stat(out); err != nil {
		t.Errorf("chart: %v", err)
	}
}

// tableHasRow reports whether the printed table has a row of 10 columns for the arm.
func tableHasRow(out, arm string) bool {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) == 10 && f[0] == arm {
			return true
		}
	}
	return false
}
