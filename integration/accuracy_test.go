package integration

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"

	pgtdriver "github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/cost/pgxexplain"
	"github.com/pgtraffic/pgtraffic/internal/engine"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/runtime"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// Accuracy benchmark: how well the engine predicts a statement's cost. A mixed workload runs on
// a table of 300k rows; before each statement the engine predicts its cost exactly as on the hot
// path (engine.Begin), and the statement's client-side time is the actual. Two baselines are computed from the same
// executions: history only (the mean actual time of the pattern's previous executions) and
// planner cost with one global k (this call's plan cost × Σ actual / Σ plan cost over all previous
// executions). Executions are scored once their pattern has run accWarmup times.

const (
	accRows       = 300_000
	accCategories = 1000 // 300 rows each
	accWarmup     = 10   // executions of a pattern before its predictions are scored
	accExecutions = 600  // per run
	accSeed       = 4    // the workload is the same in every run
)

// accQuery is one pattern of the workload; args draws one execution's arguments.
type accQuery struct {
	name string
	sql  string
	args func(r *rand.Rand) []any
}

// logUniform draws an int in [lo, hi] whose logarithm is uniform, so that range widths spread
// evenly over orders of magnitude.
func logUniform(r *rand.Rand, lo, hi int) int {
	return int(math.Round(math.Exp(math.Log(float64(lo)) + r.Float64()*(math.Log(float64(hi))-math.Log(float64(lo))))))
}

var accWorkload = []accQuery{
	{"point", `select id, category, price, name from acc_items where id = $1`,
		func(r *rand.Rand) []any { return []any{1 + r.IntN(accRows)} }},
	{"id range", `select count(*), sum(price) from acc_items where id between $1 and $2`,
		func(r *rand.Rand) []any {
			w := logUniform(r, 10, 100_000)
			lo := 1 + r.IntN(accRows-w)
			return []any{lo, lo + w - 1}
		}},
	{"category range", `select count(*), avg(price) from acc_items where category between $1 and $2`,
		func(r *rand.Rand) []any {
			w := logUniform(r, 1, 300) // 300 .. 90,000 rows
			lo := r.IntN(accCategories - w)
			return []any{lo, lo + w - 1}
		}},
	{"like", `select count(*) from acc_items where name like $1`,
		func(r *rand.Rand) []any {
			if r.IntN(2) == 0 {
				return []any{fmt.Sprintf("item-%d%%", 1+r.IntN(999))} // prefix
			}
			return []any{fmt.Sprintf("%%-%d", r.IntN(100))} // suffix
		}},
	{"aggregate", `select category, count(*), sum(price) from acc_items where id <= $1 group by category`,
		func(r *rand.Rand) []any { return []any{logUniform(r, 1000, accRows)} }},
	{"top-n", `select id, price from acc_items where category = $1 order by price desc limit 10`,
		func(r *rand.Rand) []any { return []any{r.IntN(accCategories)} }},
}

// accSample is one scored execution: actual seconds and the three predictions.
type accSample struct {
	pattern                 string
	actual                  float64
	engine, history, global float64
}

// relErr is |predicted − actual| / actual.
func relErr(predicted, actual float64) float64 { return math.Abs(predicted-actual) / actual }

// quantile returns the q-quantile (0..1) of xs by linear interpolation between closest ranks;
// NaN when xs is empty. xs is not modified.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	i := int(pos)
	if i >= len(s)-1 {
		return s[len(s)-1]
	}
	return s[i] + (pos-float64(i))*(s[i+1]-s[i])
}

// accErrors is the relative errors of each predictor over a set of samples.
type accErrors struct{ engine, history, global []float64 }

func errorsOf(samples []accSample, pattern string) accErrors {
	var e accErrors
	for _, s := range samples {
		if pattern != "" && s.pattern != pattern {
			continue
		}
		e.engine = append(e.engine, relErr(s.engine, s.actual))
		e.history = append(e.history, relErr(s.history, s.actual))
		e.global = append(e.global, relErr(s.global, s.actual))
	}
	return e
}

// baselines tracks the two baselines over the executions seen so far.
type baselines struct {
	sumActual, sumPlan float64
	perPattern         map[string][2]float64 // pattern -> {sum of actuals, count}
}

// predict returns the history-only and global-k predictions for an execution of pattern with
// planner cost plan; ok is false until the pattern and the global k both have history.
func (b *baselines) predict(pattern string, plan float64) (history, global float64, ok bool) {
	h := b.perPattern[pattern]
	if h[1] == 0 || b.sumPlan == 0 {
		return 0, 0, false
	}
	return h[0] / h[1], plan * b.sumActual / b.sumPlan, true
}

func (b *baselines) observe(pattern string, plan, actual float64) {
	if b.perPattern == nil {
		b.perPattern = map[string][2]float64{}
	}
	h := b.perPattern[pattern]
	b.perPattern[pattern] = [2]float64{h[0] + actual, h[1] + 1}
	b.sumActual += actual
	b.sumPlan += plan
}

// accConfig is one variant of the benchmark.
type accConfig struct {
	explain  string // the budget's explain mode
	parallel bool   // allow parallel query (PostgreSQL's default); off sets max_parallel_workers_per_gather = 0
}

func (c accConfig) String() string {
	s := "explain=" + c.explain
	if !c.parallel {
		s += "/parallel=off"
	}
	return s
}

// BenchmarkCostAccuracy reports, per variant, the median and p90 of |predicted − actual| / actual
// for the engine (median_err, p90_err) and for the two baselines (history_*, globalk_*), as
// fractions. One iteration is a whole workload of accExecutions statements on a fresh engine;
// `make bench` (benchtime 1s) runs one. Per-pattern figures are logged.
func BenchmarkCostAccuracy(b *testing.B) {
	ctx := context.Background()
	dsn := pgtest.Shared(b).CreateDatabase(b)
	setup, err := sql.Open("pgx", dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer setup.Close()
	for _, q := range []string{
		`create table acc_items (id int primary key, category int not null, price numeric(10, 2) not null,
			name text not null, created timestamptz not null)`,
		fmt.Sprintf(`insert into acc_items select g, g %% %d, (g::bigint * 7919 %% 100000) / 100.0, 'item-' || g,
			'2026-01-01'::timestamptz + g * interval '1 second' from generate_series(1, %d) g`, accCategories, accRows),
		`create index on acc_items (category)`,
		`vacuum analyze acc_items`,
	} {
		if _, err := setup.ExecContext(ctx, q); err != nil {
			b.Fatalf("%.40s: %v", q, err)
		}
	}
	for _, cfg := range []accConfig{{"call", true}, {"auto", true}, {"call", false}} {
		b.Run(cfg.String(), func(b *testing.B) {
			b.ReportAllocs()
			var samples []accSample
			for range b.N {
				samples = append(samples, runAccuracy(b, dsn, cfg)...)
			}
			all := errorsOf(samples, "")
			b.ReportMetric(quantile(all.engine, 0.5), "median_err")
			b.ReportMetric(quantile(all.engine, 0.9), "p90_err")
			b.ReportMetric(quantile(all.history, 0.5), "history_median_err")
			b.ReportMetric(quantile(all.history, 0.9), "history_p90_err")
			b.ReportMetric(quantile(all.global, 0.5), "globalk_median_err")
			b.ReportMetric(quantile(all.global, 0.9), "globalk_p90_err")
			b.Logf("%s: %d scored executions", cfg, len(samples))
			b.Logf("%-15s %5s %9s %9s | %9s %9s | %9s %9s | %9s", "pattern", "n", "engine", "p90",
				"history", "p90", "global k", "p90", "mean ms")
			for _, q := range append(accWorkload, accQuery{name: ""}) {
				e := errorsOf(samples, q.name)
				name, mean := q.name, 0.0
				for _, s := range samples {
					if name == "" || s.pattern == name {
						mean += s.actual
					}
				}
				if name == "" {
					name = "all"
				}
				b.Logf("%-15s %5d %9.3f %9.3f | %9.3f %9.3f | %9.3f %9.3f | %9.2f", name, len(e.engine),
					quantile(e.engine, 0.5), quantile(e.engine, 0.9), quantile(e.history, 0.5), quantile(e.history, 0.9),
					quantile(e.global, 0.5), quantile(e.global, 0.9), mean/float64(max(len(e.engine), 1))*1000)
			}
		})
	}
}

// runAccuracy runs the workload once on a fresh engine and one connection and returns the scored
// executions.
func runAccuracy(b *testing.B, dsn string, cfg accConfig) []accSample {
	ctx := tagging.With(context.Background(), "app", "accuracy")
	rules, err := pgtdriver.ParseConfig([]byte(fmt.Sprintf(`
budgets:
  - {name: all, mode: enforce, server_share: 1, burst_limit: 1000000s, explain: %s}
rules:
  - {budget: all, match: {app: accuracy}}
`, cfg.explain)))
	if err != nil {
		b.Fatal(err)
	}
	eng := engine.New(engine.Options{Logger: (&lockedBuffer{}).logger()})
	rt := runtime.New(eng, runtime.Options{})
	defer rt.Close()
	if err := rt.SetConfig(rules); err != nil {
		b.Fatal(err)
	}
	pc, err := pgx.ParseConfig(dsn)
	if err != nil {
		b.Fatal(err)
	}
	if !cfg.parallel {
		pc.RuntimeParams["max_parallel_workers_per_gather"] = "0"
	}
	db := sql.OpenDB(stdlib.GetConnector(*pc))
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()

	var samples []accSample
	err = conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("not a pgx stdlib connection: %T", dc)
		}
		r := rand.New(rand.NewPCG(accSeed, 0))
		var base baselines
		runs := map[string]int{}
		for range accExecutions {
			q := accWorkload[r.IntN(len(accWorkload))]
			args := namedArgs(q.args(r))
			vals := make([]any, len(args)) // the engine's form of the arguments
			for i := range args {
				vals[i] = args[i].Value
			}
			// The global-k baseline needs this call's plan cost whatever the explain mode; it is
			// read before Begin so that the engine's clock does not include it.
			plan, err := pgxexplain.Explain(ctx, sc.Conn(), q.sql, vals)
			if err != nil {
				return fmt.Errorf("%s: explain: %w", q.name, err)
			}
			x := new(engine.Exec)
			xctx, err := eng.Begin(ctx, x, pgxexplain.On(sc.Conn()), q.sql, vals)
			if err != nil {
				return fmt.Errorf("%s: %w", q.name, err)
			}
			predicted, costed := x.Predicted, x.Costed
			start := time.Now()
			err = drain(ctx, sc, q.sql, args)
			actual := time.Since(start).Seconds()
			x.Finish(xctx, err)
			if err != nil {
				return fmt.Errorf("%s: %w", q.name, err)
			}
			if !costed {
				return fmt.Errorf("%s: the engine made no prediction", q.name)
			}
			history, global, ok := base.predict(q.name, plan.Cost)
			if runs[q.name] >= accWarmup && ok {
				samples = append(samples, accSample{pattern: q.name, actual: actual, engine: predicted, history: history, global: global})
			}
			runs[q.name]++
			base.observe(q.name, plan.Cost, actual)
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return samples
}

// drain runs query and reads its result to the end, as an application would.
func drain(ctx context.Context, sc *stdlib.Conn, query string, args []driver.NamedValue) error {
	rows, err := sc.QueryContext(ctx, query, args)
	if err != nil {
		return err
	}
	dest := make([]driver.Value, len(rows.Columns()))
	for {
		if err := rows.Next(dest); err != nil {
			rows.Close()
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

// namedArgs puts arguments in the form database/sql hands them to a driver.
func namedArgs(vals []any) []driver.NamedValue {
	nv := make([]driver.NamedValue, len(vals))
	for i, v := range vals {
		nv[i] = driver.NamedValue{Ordinal: i + 1, Value: int64OrSelf(v)}
	}
	return nv
}

// int64OrSelf converts an int as database/sql's default converter does.
func int64OrSelf(v any) any {
	if i, ok := v.(int); ok {
		return int64(i)
	}
	return v
}

func TestQuantile(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		q    float64
		want float64
	}{
		{[]float64{3}, 0.5, 3},
		{[]float64{4, 1, 3, 2}, 0.5, 2.5},
		{[]float64{4, 1, 3, 2}, 0, 1},
		{[]float64{4, 1, 3, 2}, 1, 4},
		{[]float64{10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 110}, 0.9, 100},
	} {
		t.Run(fmt.Sprint(tc.xs, tc.q), func(t *testing.T) {
			in := slices.Clone(tc.xs)
			if got := quantile(tc.xs, tc.q); math.Abs(got-tc.want) > 1e-12 {
				t.Fatalf("quantile = %v, want %v", got, tc.want)
			}
			if !slices.Equal(in, tc.xs) {
				t.Fatal("quantile modified its input")
			}
		})
	}
	if !math.IsNaN(quantile(nil, 0.5)) {
		t.Fatal("quantile of nothing is not NaN")
	}
}

func TestBaselines(t *testing.T) {
	var b baselines
	if _, _, ok := b.predict("p", 100); ok {
		t.Fatal("a prediction before any history")
	}
	b.observe("p", 100, 0.010) // k = 1e-4
	b.observe("p", 300, 0.050)
	b.observe("q", 600, 0.040)
	for _, tc := range []struct {
		pattern        string
		plan           float64
		history, globl float64
		ok             bool
	}{
		{"p", 1000, 0.030, 1000 * 0.1 / 1000, true},
		{"q", 50, 0.040, 50 * 0.1 / 1000, true},
		{"r", 50, 0, 0, false},
	} {
		t.Run(tc.pattern, func(t *testing.T) {
			h, g, ok := b.predict(tc.pattern, tc.plan)
			if ok != tc.ok || math.Abs(h-tc.history) > 1e-12 || math.Abs(g-tc.globl) > 1e-12 {
				t.Fatalf("predict = %v, %v, %v; want %v, %v, %v", h, g, ok, tc.history, tc.globl, tc.ok)
			}
		})
	}
	if e := relErr(0.015, 0.010); math.Abs(e-0.5) > 1e-12 {
		t.Fatalf("relErr = %v", e)
	}
}
