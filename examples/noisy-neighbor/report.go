package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// stats summarises one arm's checkout latencies and its reports' load.
type stats struct {
	perSecond float64
	p50, p99  time.Duration
	load      float64 // the reports' execution seconds per second
}

func (p *armResult) stats() stats {
	lat := make([]time.Duration, len(p.critical))
	for i, s := range p.critical {
		lat[i] = s.latency
	}
	slices.Sort(lat)
	secs := max(p.measured.Seconds(), 1e-9)
	return stats{
		perSecond: float64(len(lat)) / secs,
		p50:       quantile(lat, 0.50),
		p99:       quantile(lat, 0.99),
		load:      p.noiseBusy.Seconds() / secs,
	}
}

// quantile returns the q-quantile of sorted (nearest rank), or 0 for no samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(q*float64(len(sorted)) + 0.5)
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// arms returns each arm's runs merged, in armNames order, leaving out arms that never ran.
func (r *results) arms() []*armResult {
	var out []*armResult
	for _, name := range armNames {
		if p := r.arm(name); p != nil {
			out = append(out, p)
		}
	}
	return out
}

// soloP99 is the solo arm's p99, the yardstick of the targets (0 if solo never ran).
func (r *results) soloP99() time.Duration {
	if p := r.arm(armSolo); p != nil {
		return p.stats().p99
	}
	return 0
}

// ratio is the arm's p99 over the solo p99.
func (r *results) ratio(p *armResult) float64 {
	return float64(p.stats().p99) / float64(max(r.soloP99(), 1))
}

// best returns, of the arms whose reports completed work, the one with the lowest checkout p99
// (nil if there is none).
func (r *results) best() *armResult {
	var b *armResult
	for _, p := range r.arms() {
		if p.name != armSolo && p.noiseDone > 0 && (b == nil || p.stats().p99 < b.stats().p99) {
			b = p
		}
	}
	return b
}

// printTable prints one row per arm; pool is the size of the application's pool. share is the reports' server_share × server_cores (the
// experiment's server_cores is 1): the execution seconds per second the budget gives them.
func printTable(w io.Writer, r *results, share float64, pool int) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "arm\tcheckout/s\tp99\tp99/solo\treports done\trefused\ttimed out\treport conns\treport s/s\tof share\t")
	for _, p := range r.arms() {
		s := p.stats()
		if p.name == armSolo {
			fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.2f×\t-\t-\t-\t-\t-\t-\t\n", p.name, s.perSecond, ms(s.p99), r.ratio(p))
			continue
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%.2f×\t%d\t%d\t%d\t%d\t%.2f\t%.0f%%\t\n",
			p.name, s.perSecond, ms(s.p99), r.ratio(p), p.noiseDone, p.noiseRefused, p.noiseTimedOut, p.noisePeak, s.load, 100*s.load/share)
	}
	tw.Flush()
	fmt.Fprintf(w, "report conns: the most connections the report workers held at once (pgtraffic: of the application's pool, %d)\n", pool)
	fmt.Fprintf(w, "report s/s: the reports' execution seconds per second (reports running at once, on average); of share: that over the budget's share, %g\n", share)
}

// printTargets prints the targets' verdicts. A phase is short next to burst_limit ÷ share, and
// each pgtraffic run starts with an empty bucket (it drains while the other arms run), so the
// budget also lets a full bucket through in each run: the reports can get share + burst/phase
// there, and more by what they run beyond their predicted cost (their debt is trued up after).
func printTargets(w io.Writer, r *results, share float64, burst, phase time.Duration) {
	if len(r.arms()) < len(armNames) {
		fmt.Fprintln(w, "targets: not evaluated (an arm did not run)")
		return
	}
	verdict := func(ok bool) string {
		if ok {
			return "MET"
		}
		return "MISSED"
	}
	uncontrolled, controlled := r.ratio(r.arm(armUncontrolled)), r.ratio(r.arm(armPgtraffic))
	fmt.Fprintf(w, "target: uncontrolled reports push checkout p99 to >= %.1f× solo:  %.2f×  %s (the problem)\n",
		targetUncontrolled, uncontrolled, verdict(uncontrolled >= targetUncontrolled))

	var working []string
	for _, p := range r.arms() {
		if p.name != armSolo && p.noiseDone > 0 {
			working = append(working, fmt.Sprintf("%s %.2f×", p.name, r.ratio(p)))
		}
	}
	best := r.best()
	fmt.Fprintf(w, "target: pgtraffic has the lowest checkout p99 of the arms whose reports complete work (%s):  %s (the cure)\n",
		strings.Join(working, ", "), verdict(best != nil && best.name == armPgtraffic))
	fmt.Fprintf(w, "target: under pgtraffic checkout p99 stays <= %.1f× solo:  %.2f×  %s\n",
		targetControlled, controlled, verdict(controlled <= targetControlled))

	load := r.arm(armPgtraffic).stats().load
	ceiling := share + burst.Seconds()/phase.Seconds()
	fmt.Fprintf(w, "target: under pgtraffic the reports get >= %.0f%% of their share %g:  %.2f (%.0f%%)  %s (throttled, not starved; a run of %v starting with an empty bucket allows share + burst/phase = %.2f, plus what reports ran beyond their prediction)\n",
		targetShare*100, share, load, 100*load/share, verdict(load >= targetShare*share), phase, ceiling)
}

// ms formats d in milliseconds with precision suited to sub-millisecond latencies.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v < 10:
		return fmt.Sprintf("%.2fms", v)
	case v < 100:
		return fmt.Sprintf("%.1fms", v)
	default:
		return fmt.Sprintf("%.0fms", v)
	}
}
