package main

import (
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// result is one run's figures.
type result struct {
	scenario  string
	slots     bool
	procs     int
	aggregate float64       // admitted execution seconds per second, all processes
	maxWindow float64       // the largest sliding 1-second window of admitted execution seconds
	jain      float64       // over processes with equal demand; NaN when demand is unequal
	smallBig  float64       // 10:1: a small process's mean over a big one's; NaN otherwise
	running   int           // most of the budget's statements active at once (pg_stat_activity)
	during    float64       // chaos: aggregate from the chaos to its end plus 3 s; NaN without chaos
	after     float64       // chaos: aggregate from then to the end
	recovered time.Duration // kill: from the kill until max_concurrent statements run again; -1: never
	blocked   int
	errors    int
}

// analyse turns the children's records and the samples of one run into figures over
// [from, end).
func analyse(c config, s scenario, from, end, chaosAt time.Time, reps []childReport, samples []sample) result {
	r := result{scenario: s.name, slots: s.slots, procs: s.procs, jain: math.NaN(), smallBig: math.NaN(),
		during: math.NaN(), after: math.NaN(), recovered: -1}
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
	span := end.Sub(from).Seconds()
	r.aggregate = sum(total) / span
	perWindow := int(time.Second / bucket)
	for i := 0; i+perWindow <= len(total); i++ {
		r.maxWindow = max(r.maxWindow, sum(total[i:i+perWindow]))
	}
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
		calm := chaosAt.Add(c.chaosFor + 3*time.Second)
		r.during = rateOver(total, b0, chaosAt, calm)
		r.after = rateOver(total, b0, calm, end)
		if s.name == "kill" {
			for _, x := range samples {
				if x.at.After(chaosAt) && x.running >= c.slots {
					r.recovered = x.at.Sub(chaosAt)
					break
				}
			}
		}
	}
	return r
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

// printTable writes the summary and the targets of issue 16.
func printTable(w io.Writer, c config, results []result) {
	rate := c.share // server_cores 1
	fmt.Fprintf(w, "\nrate budget: %.3g execution-s/s (server_share %g × 1 core), burst %v; slot budget: max_concurrent %d; sync_interval %v; median of %d runs\n\n",
		rate, c.share, c.burst, c.slots, c.interval, c.runs)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "scenario\tprocs\texec-s/s\t/ rate\tmax 1s window\t/ (rate+burst)\tJain\tsmall/big\tmax running\tduring chaos\tafter\tslots back\tblocked\terrors\t")
	for _, r := range results {
		ratio, win := "-", "-"
		if !r.slots {
			ratio = fmt.Sprintf("%.3f", r.aggregate/rate)
			win = fmt.Sprintf("%.3f", r.maxWindow/(rate+c.burst.Seconds()))
		}
		back := "-"
		if r.scenario == "kill" {
			back = "never"
			if r.recovered >= 0 {
				back = r.recovered.Round(10 * time.Millisecond).String()
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%s\t%.3f\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%d\t\n",
			r.scenario, r.procs, r.aggregate, ratio, r.maxWindow, win, num(r.jain), num(r.smallBig),
			r.running, num(r.during), num(r.after), back, r.blocked, r.errors)
	}
	tw.Flush()
	fmt.Fprintf(w, `
targets (issue 16): equal / rate within 0.95–1.05; max 1s window ≤ rate+burst (ratio ≤ 1);
Jain ≥ 0.95; small/big well above 0 (not starved); slots: max running ≤ %d; chaos: during ≤ 1.05 × rate
(+ one burst after a restart), after within 5%% of the rate; kill: slots back within 3 × %v.
`, c.slots, c.interval)
}

func num(x float64) string {
	if math.IsNaN(x) {
		return "-"
	}
	return fmt.Sprintf("%.3f", x)
}
