package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"text/tabwriter"
	"time"
)

// result is one run's figures.
type result struct {
	scenario  string
	run       int // 1 for a scenario's first run
	slots     bool
	procs     int
	aggregate float64 // admitted execution seconds per second, all processes
	maxWindow float64 // the largest sliding 1-second window of admitted execution seconds
	jain      float64 // over processes with equal demand; NaN when demand is unequal
	smallBig  float64 // 10:1: a small process's mean over a big one's; NaN otherwise
	running   int     // most of the budget's statements active at once (pg_stat_activity)
	during    float64 // chaos: aggregate from the chaos to its end plus 3 s; NaN without chaos
	after     float64 // chaos: aggregate from then to the end
	// kill: the longest stretch after the kill with fewer than max_concurrent statements
	// running (the killed process's slots idle until its lease lapses), and the same before it
	// (slots idle while they change hands); -1 when not measured.
	recovered, usual time.Duration
	windowAll        float64   // as maxWindow, from the start of the run (the warm-up included)
	perSecond        []float64 // admitted execution seconds in each second from the start (chart)
	callsPerProc     float64   // Redis script calls per process per second
	blocked          int
	errors           int
}

// analyse turns the children's records and the samples of one run into figures over
// [from, end).
func analyse(c config, s scenario, from, end, chaosAt, chaosEnd time.Time, reps []childReport, samples []sample) result {
	r := result{scenario: s.name, slots: s.slots, procs: s.procs, jain: math.NaN(), smallBig: math.NaN(),
		during: math.NaN(), after: math.NaN(), recovered: -1, usual: -1}
	b0, b1 := from.UnixNano()/int64(bucket), end.UnixNano()/int64(bucket)
	per := make([]float64, len(reps))
	total := make([]float64, b1-b0)
	for i, rep := range reps {
		r.blocked += rep.Blocked
		r.errors += rep.Errors
		for b, sec := range rep.Seconds {
			if b >= b0 && b < b1 {
				total[b-b0] += sec
				per[i] += sec
			}
		}
	}
	if os.Getenv("SHARED_DEBUG") != "" {
		for i := 0; i+10 <= len(total); i += 10 {
			fmt.Fprintf(os.Stderr, "%s %s: %.3f\n", s.name, from.Add(time.Duration(i)*bucket).Format("05.0"), sum(total[i:i+10]))
		}
	}
	span := end.Sub(from).Seconds()
	r.aggregate = sum(total) / span
	r.maxWindow = maxWindow(reps, b0, b1)
	r.windowAll = maxWindow(reps, from.Add(-c.warmup).UnixNano()/int64(bucket), b1)
	r.perSecond = perSecond(reps, from.Add(-c.warmup).UnixNano()/int64(bucket), b1)
	if s.big == nil && len(per) > 1 {
		r.jain = jain(per)
	}
	if s.big != nil {
		var small, big []float64
		for i, rep := range reps {
			if s.big(rep.ID) {
				big = append(big, per[i])
			} else {
				small = append(small, per[i])
			}
		}
		r.smallBig = mean(small) / mean(big)
	}
	for _, x := range samples {
		if !x.at.Before(from) && x.at.Before(end) {
			r.running = max(r.running, x.running)
		}
	}
	if !chaosAt.IsZero() {
		calm := chaosEnd.Add(3 * time.Second)
		r.during = rateOver(total, b0, chaosAt, calm)
		r.after = rateOver(total, b0, calm, end)
		if s.name == "kill" {
			r.usual = longestBelow(samples, c.slots, from, chaosAt)
			r.recovered = longestBelow(samples, c.slots, chaosAt, end)
		}
	}
	return r
}

// maxWindow is the most execution seconds admitted in a sliding 1-second window of buckets
// [b0, b1).
func maxWindow(reps []childReport, b0, b1 int64) float64 {
	total := make([]float64, b1-b0)
	for _, rep := range reps {
		for b, sec := range rep.Seconds {
			if b >= b0 && b < b1 {
				total[b-b0] += sec
			}
		}
	}
	most, per := 0.0, int(time.Second/bucket)
	for i := 0; i+per <= len(total); i++ {
		most = max(most, sum(total[i:i+per]))
	}
	return most
}

// perSecond is the execution seconds admitted in each whole second of buckets [b0, b1).
func perSecond(reps []childReport, b0, b1 int64) []float64 {
	per := int64(time.Second / bucket)
	out := make([]float64, (b1-b0)/per)
	for _, rep := range reps {
		for b, sec := range rep.Seconds {
			if i := (b - b0) / per; b >= b0 && i < int64(len(out)) {
				out[i] += sec
			}
		}
	}
	return out
}

// longestBelow is the longest stretch of samples in [from, to) with fewer than n running.
func longestBelow(samples []sample, n int, from, to time.Time) time.Duration {
	var longest time.Duration
	var since time.Time
	for _, x := range samples {
		if x.at.Before(from) || !x.at.Before(to) {
			continue
		}
		if x.running >= n {
			since = time.Time{}
			continue
		}
		if since.IsZero() {
			since = x.at
		}
		longest = max(longest, x.at.Sub(since))
	}
	return longest
}

// rateOver is the admitted execution seconds per second of total between from and to.
func rateOver(total []float64, b0 int64, from, to time.Time) float64 {
	i := max(from.UnixNano()/int64(bucket)-b0, 0)
	j := min(to.UnixNano()/int64(bucket)-b0, int64(len(total)))
	if j <= i {
		return math.NaN()
	}
	return sum(total[i:j]) / (float64(j-i) * bucket.Seconds())
}

func sum(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s
}

func mean(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	return sum(xs) / float64(len(xs))
}

// jain is Jain's fairness index: 1 when every x is equal, 1/n when one takes all.
func jain(xs []float64) float64 {
	s, s2 := 0.0, 0.0
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return math.NaN()
	}
	return s * s / (float64(len(xs)) * s2)
}

// median returns the run with the median aggregate.
func median(runs []result) result {
	slices.SortFunc(runs, func(a, b result) int {
		switch {
		case a.aggregate < b.aggregate:
			return -1
		case a.aggregate > b.aggregate:
			return 1
		}
		return 0
	})
	return runs[len(runs)/2]
}

// printTable writes every run's figures, the targets shared budgets are held to, and each
// target a run missed: a target holds in every run, not only in the median one.
func printTable(w io.Writer, c config, results []result) {
	rate := c.share // server_cores 1
	fmt.Fprintf(w, "\nrate budget: %.3g execution-s/s (server_share %g × 1 core), burst %v; slot budget: max_concurrent %d; sync_interval %v; %d runs each\n\n",
		rate, c.share, c.burst, c.slots, c.interval, c.runs)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\trun\tprocs\texec-s/s\t/ rate\tmax 1s window\t/ (rate+burst)\tfrom start\tJain\tsmall/big\tmax running\tduring chaos\tafter\tslots idle (before)\tcalls/s/proc\tblocked\terrors\t")
	for _, r := range results {
		ratio, win, all := "-", "-", "-"
		if !r.slots {
			ratio = fmt.Sprintf("%.3f", r.aggregate/rate)
			win = fmt.Sprintf("%.3f", r.maxWindow/(rate+c.burst.Seconds()))
			all = fmt.Sprintf("%.3f", r.windowAll/(rate+c.burst.Seconds()))
		}
		back := "-"
		if r.recovered >= 0 {
			back = r.recovered.Round(10*time.Millisecond).String() + " (" + r.usual.Round(10*time.Millisecond).String() + ")"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.3f\t%s\t%.3f\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%.2f\t%d\t%d\t\n",
			r.scenario, r.run, r.procs, r.aggregate, ratio, r.maxWindow, win, all, num(r.jain), num(r.smallBig),
			r.running, num(r.during), num(r.after), back, r.callsPerProc, r.blocked, r.errors)
	}
	tw.Flush()
	fmt.Fprintf(w, `
targets: equal / rate within 0.95–1.05; max 1s window ≤ rate+burst (ratio ≤ 1);
Jain ≥ 0.95; small/big well above 0 (not starved); slots: max running ≤ %d; chaos: during ≤ 1.05 × rate
(+ one burst after a restart), after within 5%% of the rate; kill: slots idle at most 3 × %v.
`, c.slots, c.interval)
	missed := 0
	for _, r := range results {
		for _, m := range r.misses(c) {
			fmt.Fprintf(w, "MISSED: %s run %d: %s\n", r.scenario, r.run, m)
			missed++
		}
	}
	if missed == 0 {
		fmt.Fprintln(w, "every run met every target")
	}
}

// misses lists the targets r missed (see printTable).
func (r result) misses(c config) []string {
	rate, bound := c.share, c.share+c.burst.Seconds()
	var out []string
	miss := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	if r.slots {
		if r.running > c.slots {
			miss("%d running, max_concurrent %d", r.running, c.slots)
		}
		if r.recovered > 3*c.interval {
			miss("slots idle %v after the kill", r.recovered)
		}
		return out
	}
	if a := r.aggregate / rate; a < 0.95 || a > 1.05 {
		miss("aggregate %.3f of rate", a)
	}
	if x := r.maxWindow / bound; x > 1 {
		miss("max 1s window %.3f of rate+burst", x)
	}
	if r.jain < 0.95 {
		miss("Jain %.3f", r.jain)
	}
	if !math.IsNaN(r.after) && math.Abs(r.after/rate-1) > 0.05 {
		miss("after the chaos %.3f of rate", r.after/rate)
	}
	if !math.IsNaN(r.during) && r.scenario != "restart" && r.during/rate > 1.05 {
		miss("during the chaos %.3f of rate", r.during/rate)
	}
	return out
}

// summary is one run's bounds in a line, so that each run can be checked, not only the
// median one.
func (r result) summary(c config) string {
	if r.slots {
		out := fmt.Sprintf("max running %d", r.running)
		if r.recovered >= 0 {
			out += fmt.Sprintf(", slots idle after the kill %v (before %v)",
				r.recovered.Round(10*time.Millisecond), r.usual.Round(10*time.Millisecond))
		}
		return out
	}
	bound := c.share + c.burst.Seconds()
	return fmt.Sprintf("/ rate %.3f, max 1s window / (rate+burst) %.3f, from start %.3f",
		r.aggregate/c.share, r.maxWindow/bound, r.windowAll/bound)
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}
