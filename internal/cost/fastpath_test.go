package cost

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// The tests in this file pin the hot-path shortcuts (cached medians, the exponent from the bits,
// the last-bucket hint, PredictVolatile) to the straightforward computations they replace.

// exponentCases returns numbers on which an exponent computed from the bits could go wrong: every
// power of two from the smallest subnormal to the largest, each with its neighbours on both
// sides, the boundaries of the subnormal range, zeros, infinities, NaN, the same negated, and
// random bit patterns and plan-cost-like numbers.
func exponentCases() []float64 {
	xs := []float64{
		0, math.SmallestNonzeroFloat64, math.Nextafter(0x1p-1022, 0), 0x1p-1022,
		math.Nextafter(0x1p-1022, 1), math.MaxFloat64, math.Inf(1), math.NaN(),
		1e-300, 1e-310, 1e300, 0.5, 1, 1.5, 3, 1000, 1234, 40_000, 1e9,
	}
	for e := -1074; e <= 1023; e++ {
		p := math.Ldexp(1, e)
		xs = append(xs, p, math.Nextafter(p, 0), math.Nextafter(p, math.Inf(1)))
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for range 100_000 {
		xs = append(xs, math.Float64frombits(rng.Uint64()), rng.Float64()*1e6, rng.ExpFloat64())
	}
	for _, x := range xs[:len(xs):len(xs)] {
		xs = append(xs, -x)
	}
	return xs
}

func TestBucketExponentMatchesFrexp(t *testing.T) {
	normals := 0
	for _, x := range exponentCases() {
		_, want := math.Frexp(x)
		if got := frexpExp(x); got != want {
			t.Fatalf("frexpExp(%g) = %d, want Frexp's %d", x, got, want)
		}
		got, ok := normalExp(x)
		abs := math.Abs(x)
		if wantOK := abs >= 0x1p-1022 && abs <= math.MaxFloat64; ok != wantOK {
			t.Fatalf("normalExp(%g) ok = %v, want %v", x, ok, wantOK)
		}
		if ok {
			normals++
			if got != want {
				t.Fatalf("normalExp(%g) = %d, want Frexp's %d", x, got, want)
			}
		}
	}
	if normals == 0 {
		t.Fatal("no normal numbers tested")
	}
}

// referenceMedian is the median as the model computed it before medians were cached: an
// insertion sort of a copy of the samples on every call.
func referenceMedian(k []float64) float64 {
	s := slices.Clone(k)
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func TestBucketMedian(t *testing.T) {
	negZero := math.Copysign(0, -1)
	// Few distinct values, so that buckets hold ties, zeros of both signs and infinities.
	values := []float64{0, negZero, math.SmallestNonzeroFloat64, 1e-9, 2.5e-6, 3e-6, 3e-6 + 1e-21,
		1, math.MaxFloat64, math.Inf(1)}
	rng := rand.New(rand.NewPCG(7, 8))
	for range 200_000 {
		var b costBucket
		b.n = uint8(1 + rng.IntN(bucketSamples))
		for i := range int(b.n) {
			b.k[i] = values[rng.IntN(len(values))]
		}
		want := referenceMedian(b.k[:b.n])
		if got := b.median(); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("median of %v = %v, want %v (bit for bit)", b.k[:b.n], got, want)
		}
		if got := b.sortedMedian(); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("sortedMedian of %v = %v, want %v (bit for bit)", b.k[:b.n], got, want)
		}
	}
	// Random samples as the model sees them: k = actual / plan cost.
	for range 200_000 {
		b := costBucket{n: bucketSamples}
		for i := range b.k {
			b.k[i] = rng.ExpFloat64() * 3e-6
		}
		if got, want := b.median(), referenceMedian(b.k[:]); got != want {
			t.Fatalf("median of %v = %v, want %v", b.k, got, want)
		}
	}
}

func TestBucketCachedMedianFollowsSamples(t *testing.T) {
	var p pattern
	rng := rand.New(rand.NewPCG(9, 10))
	for range 100_000 {
		plan := math.Ldexp(1+rng.Float64(), rng.IntN(12)) // 12 ranges for 8 buckets: replacements
		p.nPlanned++
		p.observeBucket(plan, plan*3e-6*rng.ExpFloat64())
		for i := range p.buckets {
			b := &p.buckets[i]
			if b.n == 0 {
				continue
			}
			if want := referenceMedian(b.k[:b.n]); math.Float64bits(b.med) != math.Float64bits(want) {
				t.Fatalf("bucket %d caches median %v, samples %v have %v", i, b.med, b.k[:b.n], want)
			}
		}
	}
}

// TestBucketUsedWraps covers a pattern trained more than 2^32 times with a plan cost, whose
// buckets' recency (a uint32 copy of nPlanned) wraps to 0, the mark of an empty bucket: the last
// trained bucket may then look empty, and the shortcut through it must agree with the full search.
func TestBucketUsedWraps(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for range 200 {
		var p pattern
		var ref refPattern
		p.nPlanned = math.MaxUint32 - uint64(rng.IntN(40))
		ref.nPlanned = p.nPlanned
		for range 80 { // through the wrap
			plan := math.Ldexp(1+rng.Float64(), rng.IntN(4)) // 4 ranges: the hint often hits
			actual := plan * rng.ExpFloat64()
			p.nPlanned++
			ref.nPlanned++
			p.observeBucket(plan, actual)
			ref.observeBucket(plan, actual)
			for e := -1; e <= 5; e++ {
				pc := math.Ldexp(1.5, e)
				got, gotOK := p.bucketK(pc)
				want, wantOK := ref.bucketK(pc)
				if gotOK != wantOK || math.Float64bits(got) != math.Float64bits(want) {
					t.Fatalf("nPlanned %d: bucketK(%v) = %v, %v; reference %v, %v", p.nPlanned, pc, got, gotOK, want, wantOK)
				}
			}
		}
	}
}

// refModel is the prediction model as it was before the hot path was optimised, kept verbatim in
// its arithmetic: a map of patterns (no bound), buckets found by three passes, math.Frexp, and a
// median sorted on every prediction. Model must predict exactly what it predicts.
type refModel struct {
	patterns       map[uint64]*refPattern
	gActual, gPlan float64
	gN             uint64
	explainMean    float64
	explainN       uint64
}

type refPattern struct {
	n              uint64
	mean, variance float64
	nPlanned       uint64
	actualP, plan  float64
	buckets        [costBuckets]refBucket
}

type refBucket struct {
	exp  int
	used uint32
	n    int
	next int
	k    [bucketSamples]float64
}

func newRefModel() *refModel { return &refModel{patterns: map[uint64]*refPattern{}} }

func (m *refModel) observe(fp uint64, planCost, actual float64) {
	if !(actual >= 0) || math.IsInf(actual, 0) {
		return
	}
	p := m.patterns[fp]
	if p == nil {
		p = &refPattern{}
		m.patterns[fp] = p
	}
	p.n++
	if p.n == 1 {
		p.mean, p.variance = actual, 0
	} else {
		d := actual - p.mean
		p.mean += alphaPattern * d
		p.variance = (1 - alphaPattern) * (p.variance + alphaPattern*d*d)
	}
	if !validPlan(planCost) {
		return
	}
	p.nPlanned++
	p.actualP = ema(p.actualP, actual, alphaPattern, p.nPlanned)
	p.plan = ema(p.plan, planCost, alphaPattern, p.nPlanned)
	p.observeBucket(planCost, actual)
	m.gN++
	m.gActual = ema(m.gActual, actual, alphaGlobal, m.gN)
	m.gPlan = ema(m.gPlan, planCost, alphaGlobal, m.gN)
}

func (p *refPattern) observeBucket(planCost, actual float64) {
	_, exp := math.Frexp(planCost)
	var b *refBucket
	for i := range p.buckets {
		c := &p.buckets[i]
		if c.used != 0 && c.exp == exp {
			b = c
			break
		}
		if b == nil || c.used < b.used {
			b = c
		}
	}
	if b.used == 0 || b.exp != exp {
		*b = refBucket{exp: exp}
	}
	b.used = uint32(p.nPlanned)
	b.k[b.next] = actual / planCost
	b.next = (b.next + 1) % bucketSamples
	b.n = min(b.n+1, bucketSamples)
}

func (p *refPattern) bucketK(planCost float64) (float64, bool) {
	_, exp := math.Frexp(planCost)
	for _, d := range [...]int{0, 1, -1} {
		for i := range p.buckets {
			if b := &p.buckets[i]; b.used != 0 && b.exp == exp+d {
				return referenceMedian(b.k[:b.n]), true
			}
		}
	}
	return 0, false
}

func (m *refModel) observeExplain(seconds float64) {
	if !(seconds >= 0) || math.IsInf(seconds, 0) {
		return
	}
	m.explainN++
	m.explainMean = ema(m.explainMean, seconds, alphaExplain, m.explainN)
}

func (m *refModel) predict(fp uint64, planCost float64) (float64, bool) {
	p := m.patterns[fp]
	if validPlan(planCost) {
		if p != nil && p.nPlanned > 0 {
			if k, ok := p.bucketK(planCost); ok {
				return planCost * k, true
			}
			return planCost * (p.actualP / p.plan), true
		}
		gk := DefaultGlobalK
		if m.gN > 0 {
			gk = m.gActual / m.gPlan
		}
		return planCost * gk, true
	}
	if p != nil && p.n > 0 {
		return p.mean, true
	}
	return 0, false
}

func (m *refModel) volatile(fp uint64) bool {
	p := m.patterns[fp]
	if p == nil || p.n < volatileMinSamples || m.explainN == 0 {
		return false
	}
	return p.mean > volatileExplainRatio*m.explainMean && math.Sqrt(p.variance) > volatileCV*p.mean
}

// randomPlanCost returns a plan cost for the randomized tests: mostly a few per pattern (as the
// plan cache hands out), sometimes any range, and sometimes no plan or an invalid one.
func randomPlanCost(rng *rand.Rand, fp uint64) float64 {
	switch r := rng.IntN(20); {
	case r < 12:
		return float64(100 * (1 + fp%7) * uint64(1+rng.IntN(3)))
	case r < 17:
		return math.Ldexp(1+rng.Float64(), rng.IntN(30)-5)
	case r == 17:
		return 0
	case r == 18:
		return []float64{-1, math.NaN(), math.Inf(1), math.SmallestNonzeroFloat64, 1e-310}[rng.IntN(5)]
	default:
		return math.Nextafter(math.Ldexp(1, rng.IntN(20)), math.Inf(rng.IntN(2)*2-1))
	}
}

// randomActual returns an execution time: usually plan-proportional with noise, sometimes wild
// (to make patterns volatile), sometimes zero or invalid.
func randomActual(rng *rand.Rand, planCost float64) float64 {
	switch r := rng.IntN(20); {
	case r < 12:
		if validPlan(planCost) {
			return planCost * 3e-6 * (0.5 + rng.Float64())
		}
		return 0.01 * rng.Float64()
	case r < 17:
		return rng.ExpFloat64() * 0.05
	case r == 17:
		return []float64{0, math.Copysign(0, -1)}[rng.IntN(2)]
	default:
		return []float64{-1, math.NaN(), math.Inf(1)}[rng.IntN(3)]
	}
}

// TestModelMatchesReference feeds the same random history to Model and to refModel and requires
// bit-identical predictions and the same volatility after every step.
func TestModelMatchesReference(t *testing.T) {
	const patterns = 40
	m, ref := NewModel(patterns), newRefModel() // a bound no pattern exceeds: no evictions
	rng := rand.New(rand.NewPCG(11, 12))
	for step := range 200_000 {
		fp := uint64(rng.IntN(patterns))
		switch r := rng.IntN(50); {
		case r == 0:
			s := []float64{0.0005, 0.002, 0.05, -1, math.NaN()}[rng.IntN(5)]
			m.ObserveExplain(s)
			ref.observeExplain(s)
		case r < 25:
			pc := randomPlanCost(rng, fp)
			a := randomActual(rng, pc)
			m.Observe(fp, pc, a)
			ref.observe(fp, pc, a)
		}
		pc := randomPlanCost(rng, fp)
		got, gotOK := m.Predict(fp, pc)
		want, wantOK := ref.predict(fp, pc)
		if gotOK != wantOK || math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("step %d: Predict(%d, %v) = %v, %v; reference %v, %v", step, fp, pc, got, gotOK, want, wantOK)
		}
		if got, want := m.Volatile(fp), ref.volatile(fp); got != want {
			t.Fatalf("step %d: Volatile(%d) = %v, reference %v", step, fp, got, want)
		}
	}
}

// TestModelForecast requires Forecast to return exactly what Predict, Volatile and Top's count
// return, over a random history that also evicts patterns from a small table; and a stable
// forecast, kept, to equal a fresh one for as long as Gen is unchanged.
func TestModelForecast(t *testing.T) {
	m := NewModel(16)
	rng := rand.New(rand.NewPCG(13, 14))
	type kept struct {
		pc float64
		f  Forecast
	}
	keep := map[uint64]kept{}
	volatile, unknown, reused, expired := 0, 0, 0, 0
	for step := range 200_000 {
		fp := uint64(rng.IntN(24)) // more fingerprints than the bound
		switch r := rng.IntN(50); {
		case r == 0:
			m.ObserveExplain([]float64{0.0005, 0.002, 0.05, -1}[rng.IntN(4)])
		case r < 25:
			pc := randomPlanCost(rng, fp)
			m.Observe(fp, pc, randomActual(rng, pc))
		}
		// A kept forecast of any pattern: valid exactly while its generation holds.
		kfp := uint64(rng.IntN(24))
		if k, ok := keep[kfp]; ok {
			if m.Gen(kfp) == k.f.Gen {
				if got := m.Forecast(kfp, k.pc); got.Seconds != k.f.Seconds || got.OK != k.f.OK ||
					got.Volatile != k.f.Volatile {
					t.Fatalf("step %d: kept forecast of %d at %v is %+v, fresh %+v with the same Gen", step, kfp, k.pc, k.f, got)
				}
				reused++
			} else {
				delete(keep, kfp)
				expired++
			}
		}
		pc := randomPlanCost(rng, fp)
		f := m.Forecast(fp, pc)
		wantS, wantOK := m.Predict(fp, pc)
		if f.OK != wantOK || math.Float64bits(f.Seconds) != math.Float64bits(wantS) {
			t.Fatalf("step %d: Forecast(%d, %v) predicts %v, %v; Predict %v, %v", step, fp, pc, f.Seconds, f.OK, wantS, wantOK)
		}
		if want := m.Volatile(fp); f.Volatile != want {
			t.Fatalf("step %d: Forecast(%d) volatile = %v, Volatile %v", step, fp, f.Volatile, want)
		}
		var count uint64
		for _, s := range m.Top(24) {
			if s.Fingerprint == fp {
				count = s.Count
			}
		}
		if f.Samples != count {
			t.Fatalf("step %d: Forecast(%d) samples = %d, Top's count %d", step, fp, f.Samples, count)
		}
		if f.Stable {
			keep[fp] = kept{pc, f}
		}
		if f.Volatile {
			volatile++
		}
		if _, known := m.MeanActual(fp); !known {
			unknown++
		}
	}
	// The history must reach both answers, patterns outside the table, and both fates of a kept
	// forecast.
	if volatile == 0 || unknown == 0 || reused == 0 || expired == 0 {
		t.Fatalf("history too tame: %d volatile answers, %d for unknown patterns, %d forecasts reused, %d expired",
			volatile, unknown, reused, expired)
	}
}

func TestModelForecastAllocs(t *testing.T) {
	m := NewModel(0)
	m.ObserveExplain(0.001)
	for range 10 {
		m.Observe(1, 10, 0.001)
	}
	if n := testing.AllocsPerRun(100, func() { m.Forecast(1, 10) }); n != 0 {
		t.Fatalf("Forecast allocates %v times, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { m.Observe(1, 10, 0.001) }); n != 0 {
		t.Fatalf("Observe of a known pattern allocates %v times, want 0", n)
	}
}
