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
	secs := (p.end - p.start).Seconds()
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

// ratio is p99 / the solo p99 for each phase, in order.
func (r *results) ratios() []float64 {
	out := make([]float64, len(r.phases))
	if len(r.phases) == 0 {
		return out
	}
	solo := r.phases[0].stats().p99
	for i, p := range r.phases {
		out[i] = float64(p.stats().p99) / float64(max(solo, 1))
	}
	return out
}

func printTable(w io.Writer, r *results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tcheckout/s\tp50\tp99\tp99/solo\treports done\treports blocked\treport load\t")
	ratios := r.ratios()
	for i, p := range r.phases {
		s := p.stats()
		load := p.noiseBusy.Seconds() / (p.end - p.start).Seconds()
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%.2f×\t%d\t%d\t%.2f\t\n",
			p.name, s.perSecond, ms(s.p50), ms(s.p99), ratios[i], p.noiseDone, p.noiseBlocked, load)
	}
	tw.Flush()
	fmt.Fprintln(w, "report load: execution seconds of completed reports per second (1.00 = one core's worth)")
}

func printTargets(w io.Writer, r *results) {
	if len(r.phases) < 3 {
		fmt.Fprintln(w, "targets: not evaluated (a phase did not run)")
		return
	}
	ratios := r.ratios()
	verdict := func(ok bool) string {
		if ok {
			return "MET"
		}
		return "MISSED"
	}
	fmt.Fprintf(w, "target: uncontrolled noise pushes checkout p99 to >= %.1f× solo:  %.2f×  %s (the problem)\n",
		targetUncontrolled, ratios[1], verdict(ratios[1] >= targetUncontrolled))
	fmt.Fprintf(w, "target: under the budget checkout p99 stays <= %.1f× solo:         %.2f×  %s (the cure)\n",
		targetControlled, ratios[2], verdict(ratios[2] <= targetControlled))
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
