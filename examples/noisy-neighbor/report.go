package main

import (
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"
)

// stats summarises one phase's checkout latencies.
type stats struct {
	perSecond float64
	p50, p99  time.Duration
}

func (p *phaseResult) stats() stats {
	lat := make([]time.Duration, len(p.critical))
	for i, s := range p.critical {
		lat[i] = s.latency
	}
	slices.Sort(lat)
	secs := p.measured.Seconds()
	return stats{
		perSecond: float64(len(lat)) / max(secs, 1e-9),
		p50:       quantile(lat, 0.50),
		p99:       quantile(lat, 0.99),
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

// phases returns each phase's runs merged, in phaseNames order, leaving out phases that never ran.
func (r *results) phases() []*phaseResult {
	var out []*phaseResult
	for _, name := range phaseNames {
		if p := r.phase(name); p != nil {
			out = append(out, p)
		}
	}
	return out
}

// soloP99 is the solo phase's p99, the yardstick of the targets (0 if solo never ran).
func (r *results) soloP99() time.Duration {
	if p := r.phase("solo"); p != nil {
		return p.stats().p99
	}
	return 0
}

// ratio is the phase's p99 over the solo p99.
func (r *results) ratio(p *phaseResult) float64 {
	return float64(p.stats().p99) / float64(max(r.soloP99(), 1))
}

func printTable(w io.Writer, r *results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tcheckout/s\tp50\tp99\tp99/solo\treports done\treports blocked\treport load\t")
	for _, p := range r.phases() {
		s := p.stats()
		load := p.noiseBusy.Seconds() / p.measured.Seconds()
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%.2f×\t%d\t%d\t%.2f\t\n",
			p.name, s.perSecond, ms(s.p50), ms(s.p99), r.ratio(p), p.noiseDone, p.noiseBlocked, load)
	}
	tw.Flush()
	fmt.Fprintln(w, "report load: execution seconds of reports per second, i.e. reports running at once on average")
}

// printTargets prints the targets' verdicts. share is the reports' server_share × server_cores
// (the demo's server_cores is 1): the execution seconds per second they are entitled to in the
// long run. A phase is short next to burst_limit, so the budget also lets a full bucket through
// in each controlled phase: the most the reports can get there is share + burst/phase.
func printTargets(w io.Writer, r *results, share float64, burst, phase time.Duration) {
	if len(r.phases()) < len(phaseNames) {
		fmt.Fprintln(w, "targets: not evaluated (a phase did not run)")
		return
	}
	uncontrolled, controlled := r.ratio(r.phase("uncontrolled")), r.ratio(r.phase("controlled"))
	verdict := func(ok bool) string {
		if ok {
			return "MET"
		}
		return "MISSED"
	}
	fmt.Fprintf(w, "target: uncontrolled noise pushes checkout p99 to >= %.1f× solo:  %.2f×  %s (the problem)\n",
		targetUncontrolled, uncontrolled, verdict(uncontrolled >= targetUncontrolled))
	fmt.Fprintf(w, "target: under the budget checkout p99 stays <= %.1f× solo:         %.2f×  %s (the cure)\n",
		targetControlled, controlled, verdict(controlled <= targetControlled))
	c := r.phase("controlled")
	load := c.noiseBusy.Seconds() / c.measured.Seconds()
	ceiling := share + burst.Seconds()/phase.Seconds()
	fmt.Fprintf(w, "target: under the budget the reports get >= %.0f%% of their share %.2f and at most share + burst/phase %.2f: %.2f  %s (throttled, not starved)\n",
		targetShare*100, share, ceiling, load, verdict(load >= targetShare*share && load <= ceiling))
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
