package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// loadRules: an enforce budget (two statements at once, none predicted above 25 ms, none
// running past 100 ms), a warn budget with like limits per tenant, and a zero limit that blocks
// one table outright, by a rule that expires in an hour.
const loadRules = `
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 2
    per_query_limit: 25ms
    max_duration: 100ms
  - name: tenants
    mode: warn
    per: tenant
    max_concurrent: 1
    per_query_limit: 25ms
    max_duration: 30ms
  - name: frozen
    mode: enforce
    max_concurrent: 0
rules:
  - budget: reporting
    match: {app: reporting}
  - budget: tenants
    match: {app: web}
  - budget: frozen
    match: {table: audit}
    until: %s
`

// The statements of the load: the reporting app's and the web app's (two per tenant).
const (
	loadRows    = "SELECT id, note FROM orders WHERE id > $1 ORDER BY id LIMIT 20" // rows read one by one
	loadScan    = "SELECT count(*) FROM orders, pg_sleep(0.005) WHERE id > $1"     // within the limit
	loadSlow    = "SELECT pg_sleep(0.3)"                                           // overruns, then refused by per_query_limit
	loadFrozen  = "SELECT count(*) FROM audit WHERE id > $1"                       // the zero limit's
	loadUpdate  = "UPDATE orders SET note = $1 WHERE id = $2"
	loadSlowWeb = "SELECT pg_sleep(0.04) FROM orders WHERE id = $1" // above the warn budget's limits
	loadPoint   = "SELECT note FROM orders WHERE id = $1"
)

// loadTally is what the workers saw: statements that ran per app (those cancelled past
// max_duration apart), refusals per budget/reason.
type loadTally struct {
	mu      sync.Mutex
	ran     map[string]int64 // app → statements that ran to the end
	overran map[string]int64 // app → statements cancelled past max_duration
	refused map[string]int64 // budget/reason → refusals
	errs    []error          // anything else
}

func (l *loadTally) note(app string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var be *driver.BlockedError
	switch {
	case err == nil:
		l.ran[app]++
	case errors.Is(err, driver.ErrOverrun):
		l.overran[app]++
	case errors.As(err, &be):
		l.refused[be.Budget+"/"+be.Reason]++
	default:
		l.errs = append(l.errs, err)
	}
}

// statusLoad is a connector under load: workers of both apps run until stop is called.
type statusLoad struct {
	s     *telSetup
	tally *loadTally
	stop  func() // stops the workers and waits for them
}

// startStatusLoad starts 6 reporting and 6 web workers on a fresh database with loadRules,
// and returns once each worker has run a round of its statements. Each pauses 2 ms after a
// refusal, which costs no round trip, so that the load stays on the server and not on the
// test machine's cores. Before each statement a web worker pauses up to a millisecond at random:
// the two workers of a tenant run the same statements, whose lengths barely vary, so without it
// they keep the phase they start with, and one that keeps their short statements apart for the
// whole run leaves the warn budget's concurrency limit untouched.
func startStatusLoad(t *testing.T) *statusLoad {
	t.Helper()
	until := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	s := newTelSetup(t, fmt.Sprintf(loadRules, until),
		driver.WithTracerProvider(noop.NewTracerProvider()),
		driver.WithLogger(slog.New(slog.NewTextHandler(&lockedBuffer{}, &slog.HandlerOptions{Level: slog.LevelError}))))
	// The frozen budget refuses every statement on audit: make it without pgtraffic.
	cc, err := pgx.ParseConfig(s.srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cc.Database = s.dbName
	raw, err := pgx.ConnectConfig(context.Background(), cc)
	if err != nil {
		t.Fatal(err)
	}
	_, err = raw.Exec(context.Background(), `CREATE TABLE audit (id int PRIMARY KEY);
		INSERT INTO audit SELECT generate_series(1, 100)`)
	raw.Close(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s.db.SetMaxOpenConns(12)
	s.db.SetMaxIdleConns(12)
	l := &statusLoad{s: s, tally: &loadTally{ran: map[string]int64{}, overran: map[string]int64{},
		refused: map[string]int64{}}}

	ctx, cancel := context.WithCancel(context.Background())
	var wg, warm sync.WaitGroup
	worker := func(w int, app string, tags []string, run []func(context.Context, int) error) {
		defer wg.Done()
		tctx := tagging.With(context.Background(), tags...)
		for i := 0; ; i++ {
			if i == len(run) {
				warm.Done()
			}
			if ctx.Err() != nil {
				return
			}
			if app == "web" {
				time.Sleep(rand.N(time.Millisecond))
			}
			err := run[(w+i)%len(run)](tctx, w*100+i%100+1)
			l.tally.note(app, err)
			if err != nil {
				time.Sleep(2 * time.Millisecond)
			}
		}
	}
	db := s.db
	reporting := []func(context.Context, int) error{
		func(ctx context.Context, id int) error {
			rows, err := db.QueryContext(ctx, loadRows, id%900)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var n int
				var note string
				if err := rows.Scan(&n, &note); err != nil {
					return err
				}
			}
			return rows.Err()
		},
		func(ctx context.Context, id int) error {
			var n int
			return db.QueryRowContext(ctx, loadScan, id%900).Scan(&n)
		},
		func(ctx context.Context, _ int) error { _, err := db.ExecContext(ctx, loadSlow); return err },
		func(ctx context.Context, id int) error {
			var n int
			return db.QueryRowContext(ctx, loadFrozen, id%50).Scan(&n)
		},
	}
	web := []func(context.Context, int) error{
		func(ctx context.Context, id int) error {
			_, err := db.ExecContext(ctx, loadUpdate, "n"+strconv.Itoa(id), id)
			return err
		},
		func(ctx context.Context, id int) error { _, err := db.ExecContext(ctx, loadSlowWeb, id); return err },
		func(ctx context.Context, id int) error {
			var note string
			return db.QueryRowContext(ctx, loadPoint, id).Scan(&note)
		},
	}
	for w := range 6 {
		wg.Add(2)
		warm.Add(2)
		go worker(w, "reporting", []string{"app", "reporting"}, reporting)
		go worker(w, "web", []string{"app", "web", "tenant", "t" + strconv.Itoa(w%3)}, web)
	}
	var once sync.Once
	l.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(l.stop)
	warm.Wait()
	return l
}

// decisionMetric sums the pgtraffic.decisions metric per budget/decision/reason.
func decisionMetric(t *testing.T, s *telSetup) map[string]int64 {
	t.Helper()
	sum, ok := s.metrics(t)["pgtraffic.decisions"].Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatal("no pgtraffic.decisions sum")
	}
	out := map[string]int64{}
	for _, dp := range sum.DataPoints {
		b, _ := dp.Attributes.Value("pgtraffic.budget")
		d, _ := dp.Attributes.Value("pgtraffic.decision")
		r, _ := dp.Attributes.Value("pgtraffic.reason")
		out[b.AsString()+"/"+d.AsString()+"/"+r.AsString()] += dp.Value
	}
	return out
}

// statusCounts are a snapshot's budget counts keyed as decisionMetric keys the metric.
func statusCounts(s driver.Snapshot) map[string]int64 {
	out := map[string]int64{}
	for _, b := range s.Budgets {
		if b.Admitted > 0 {
			out[b.Name+"/allow/"] = int64(b.Admitted)
		}
		for r, n := range b.WarnedBy {
			out[b.Name+"/warn/"+r] = int64(n)
		}
		for r, n := range b.BlockedBy {
			out[b.Name+"/block/"+r] = int64(n)
		}
	}
	return out
}

func statusJSON(t *testing.T, url string) driver.Snapshot {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var s driver.Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

func sortedKeys(m map[string]int64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, fmt.Sprintf("%s=%d", k, m[k]))
	}
	sort.Strings(keys)
	return strings.Join(keys, " ")
}

// TestStatusConsoleUnderLoad runs an enforce, a warn and a zero-limit budget under concurrent
// load against PostgreSQL. While the load runs, headless Chromium renders the status page:
// recent refusals are one row per budget, decision, reason and pattern with a count and the
// last time, and each budget's chart has its series. Once the load stops, each budget's counts
// in the Snapshot and in the Handler's JSON equal the pgtraffic.decisions metric, per decision
// and reason; the warn budget warned and blocked nothing; the refusals equal those the workers
// saw, and the statements admitted (or warned) those that ran.
//
// The screenshot is written to the test's artifact directory (go test -artifacts). To replace
// the committed integration/testdata/status-console.png with it:
//
//	PGTRAFFIC_UPDATE_SCREENSHOT=1 go test ./integration -run TestStatusConsoleUnderLoad -count=1
func TestStatusConsoleUnderLoad(t *testing.T) {
	l := startStatusLoad(t)
	srv := httptest.NewServer(l.s.conn.Handler())
	t.Cleanup(srv.Close)
	time.Sleep(3 * time.Second) // load for a few seconds: nothing below depends on how much ran

	t.Run("chromium", func(t *testing.T) { statusConsoleInChromium(t, srv.URL) })

	l.stop()
	if len(l.tally.errs) > 0 {
		t.Fatalf("%d statements failed, first: %v", len(l.tally.errs), l.tally.errs[0])
	}
	metric := decisionMetric(t, l.s)
	snap := l.s.conn.Snapshot()
	served := statusJSON(t, srv.URL+"/")
	t.Logf("metric:  %s", sortedKeys(metric))
	t.Logf("workers: ran %v, cancelled past max_duration %v, refused %s", l.tally.ran, l.tally.overran,
		sortedKeys(l.tally.refused))
	if got := statusCounts(snap); !maps.Equal(got, metric) {
		t.Errorf("Snapshot counts %s\nmetric %s", sortedKeys(got), sortedKeys(metric))
	}
	if got := statusCounts(served); !maps.Equal(got, metric) {
		t.Errorf("Handler counts %s\nmetric %s", sortedKeys(got), sortedKeys(metric))
	}

	budgets := map[string]driver.BudgetStatus{}
	for _, b := range snap.Budgets {
		budgets[b.Name] = b
	}
	rep, ten, fro := budgets["reporting"], budgets["tenants"], budgets["frozen"]
	// What the workers saw. Every refusal is an enforce budget's, by its reason; a statement
	// cancelled past max_duration was admitted, then counted as a block (reason max_duration).
	// A statement that ran past the warn budget's max_duration was decided at admission, then
	// warned about at its end (reason max_duration).
	seen := map[string]int64{}
	for _, b := range []driver.BudgetStatus{rep, fro} {
		for r, n := range b.BlockedBy {
			if r != driver.ReasonMaxDuration {
				seen[b.Name+"/"+r] = int64(n)
			}
		}
	}
	if !maps.Equal(seen, l.tally.refused) {
		t.Errorf("refusals counted %s, seen by the workers %s", sortedKeys(seen), sortedKeys(l.tally.refused))
	}
	if n := int64(rep.BlockedBy[driver.ReasonMaxDuration]); n != l.tally.overran["reporting"] || n == 0 {
		t.Errorf("reporting counted %d overruns, the workers saw %d (want some)", n, l.tally.overran["reporting"])
	}
	// Every statement that ran was admitted; one cancelled past max_duration was too, unless
	// its EXPLAIN ran past it (a loaded machine), which cuts it off before its admission.
	if got, ran, overran := int64(rep.Admitted+rep.Warned), l.tally.ran["reporting"], l.tally.overran["reporting"]; got < ran || got > ran+overran {
		t.Errorf("reporting admitted %d and warned %d, but %d ran and %d were cancelled past max_duration",
			rep.Admitted, rep.Warned, ran, overran)
	}
	if got, ran := int64(ten.Admitted+ten.Warned-ten.WarnedBy[driver.ReasonMaxDuration]), l.tally.ran["web"]; got != ran ||
		l.tally.overran["web"] != 0 {
		t.Errorf("tenants admitted %d and warned %d (%d past max_duration), but %d ran (%d cancelled)",
			ten.Admitted, ten.Warned, ten.WarnedBy[driver.ReasonMaxDuration], ran, l.tally.overran["web"])
	}
	if ten.Blocked != 0 || ten.WarnedBy["per_query_limit"] < 2 || ten.WarnedBy["concurrency"] == 0 ||
		ten.WarnedBy[driver.ReasonMaxDuration] < 2 {
		t.Errorf("warn budget warned %v, blocked %v: want warnings by per_query_limit, concurrency and max_duration, nothing blocked",
			ten.WarnedBy, ten.BlockedBy)
	}
	if rep.BlockedBy["per_query_limit"] < 2 || rep.BlockedBy["concurrency"] == 0 {
		t.Errorf("enforce budget blocked %v: want refusals by per_query_limit and concurrency", rep.BlockedBy)
	}
	if fro.Admitted != 0 || fro.Warned != 0 || fro.BlockedBy["concurrency"] < 2 || len(fro.BlockedBy) != 1 {
		t.Errorf("zero-limit budget admitted %d, warned %v, blocked %v: want concurrency refusals only",
			fro.Admitted, fro.WarnedBy, fro.BlockedBy)
	}
	if len(snap.RuleExpiries) != 1 || snap.RuleExpiries[0].Budget != "frozen" {
		t.Errorf("rule expiries %+v: want the frozen rule's", snap.RuleExpiries)
	}
	// The summary line and the refusal groups add up to the budgets' counts.
	if want := rep.Blocked + fro.Blocked; snap.Counters.Blocked != want {
		t.Errorf("summary %d blocked, budgets %d", snap.Counters.Blocked, want)
	}
	if snap.Counters.Warned != ten.Warned {
		t.Errorf("summary %d warned, budgets %d", snap.Counters.Warned, ten.Warned)
	}
	groups := map[string]int64{}
	for _, g := range snap.RecentBlocks {
		groups[g.Budget+"/"+g.Decision+"/"+g.Reason] += int64(g.Count)
	}
	refusals := maps.Clone(metric)
	maps.DeleteFunc(refusals, func(k string, _ int64) bool { return strings.HasSuffix(k, "/allow/") })
	if !maps.Equal(groups, refusals) {
		t.Errorf("recent refusal groups add up to %s, metric %s", sortedKeys(groups), sortedKeys(refusals))
	}
	// The history holds every decision since the budgets appeared (less than five minutes ago).
	for _, b := range snap.Budgets {
		var a, w, bl uint64
		for _, h := range b.History {
			a, w, bl = a+h.Admitted, w+h.Warned, bl+h.Blocked
		}
		if a != b.Admitted || w != b.Warned || bl != b.Blocked {
			t.Errorf("%s: history adds up to %d/%d/%d, totals %d/%d/%d", b.Name, a, w, bl, b.Admitted, b.Warned, b.Blocked)
		}
	}
}

var (
	groupRow   = regexp.MustCompile(`(?s)<tr class="group">(.*?)</tr>`)
	cell       = regexp.MustCompile(`(?s)<td[^>]*>(.*?)</td>`)
	budgetRow  = regexp.MustCompile(`(?s)<tr data-budget="([^"]+)">(.*?)</tr>`)
	series     = regexp.MustCompile(`<polyline class="(\w+)"[^>]*points="([^"]*)"`)
	clockTime  = regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3}$`)
	tagPattern = regexp.MustCompile(`<[^>]+>`)
)

// statusConsoleInChromium renders the status page at url, under load, in headless Chromium.
func statusConsoleInChromium(t *testing.T, url string) {
	bin := chromium(t)
	dom := string(runChromium(t, bin, url, "--dump-dom"))

	// Recent refusals: one row per budget, decision, reason and pattern.
	type group struct {
		count      int64
		last, text string
	}
	groups := map[string]group{}
	for _, m := range groupRow.FindAllStringSubmatch(dom, -1) {
		var c []string
		for _, td := range cell.FindAllStringSubmatch(m[1], -1) {
			c = append(c, tagPattern.ReplaceAllString(td[1], ""))
		}
		if len(c) != 8 {
			t.Fatalf("refusal row with %d cells: %s", len(c), m[0])
		}
		k := c[3] + "/" + c[4] + "/" + c[5] + "/" + c[6]
		if _, dup := groups[k]; dup {
			t.Errorf("refusals of %s in two rows", k)
		}
		n, err := strconv.ParseInt(c[2], 10, 64)
		if err != nil {
			t.Errorf("refusal row count %q", c[2])
		}
		groups[k] = group{count: n, last: c[0], text: c[7]}
	}
	for _, want := range []struct{ budget, decision, reason, query string }{
		{"frozen", "block", "concurrency", loadFrozen},
		{"reporting", "block", "per_query_limit", "SELECT pg_sleep($1)"},
		{"tenants", "warn", "per_query_limit", "SELECT pg_sleep($2) FROM orders WHERE id = $1"},
	} {
		var found bool
		for k, g := range groups {
			if strings.HasPrefix(k, want.budget+"/"+want.decision+"/"+want.reason+"/") && htmlText(g.text) == want.query {
				found = true
				if g.count < 2 || !clockTime.MatchString(g.last) {
					t.Errorf("group %s: count %d, last %q: want a count above 1 and a time", k, g.count, g.last)
				}
			}
		}
		if !found {
			t.Errorf("no refusal row for %+v", want)
		}
	}

	// Each budget's chart has the series of what it decided.
	charts := map[string]map[string]bool{} // budget → series with a point above the baseline
	for _, m := range budgetRow.FindAllStringSubmatch(dom, -1) {
		if !strings.Contains(m[2], `<svg class="chart"`) {
			t.Errorf("budget %s has no chart", m[1])
		}
		charts[m[1]] = map[string]bool{}
		for _, s := range series.FindAllStringSubmatch(m[2], -1) {
			charts[m[1]][s[1]] = aboveBaseline(s[2])
		}
	}
	for budget, want := range map[string][]string{
		"reporting": {"admitted", "blocked"},
		"tenants":   {"admitted", "warned"},
		"frozen":    {"blocked"},
	} {
		for _, s := range want {
			if !charts[budget][s] {
				t.Errorf("budget %s: chart series %s empty (charts %v)", budget, s, charts[budget])
			}
		}
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	shot := filepath.Join(t.ArtifactDir(), "status-console.png")
	runChromium(t, bin, url, "--screenshot="+shot, "--window-size=1200,1400")
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if colours := distinctColours(img, 64); colours < 8 {
		t.Errorf("screenshot has %d distinct colours: not a rendered page", colours)
	}
	t.Logf("screenshot: %s", shot)
	if os.Getenv("PGTRAFFIC_UPDATE_SCREENSHOT") == "1" {
		b, err := os.ReadFile(shot)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join("testdata", "status-console.png"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// htmlText undoes the escapes html/template writes in query texts.
func htmlText(s string) string {
	return strings.NewReplacer("&gt;", ">", "&lt;", "<", "&amp;", "&", "&#39;", "'", "&#34;", `"`).Replace(s)
}

// aboveBaseline reports whether an SVG polyline has a point above the chart's zero line, the
// largest y among its points.
func aboveBaseline(points string) bool {
	var ys []float64
	for _, p := range strings.Fields(points) {
		_, y, ok := strings.Cut(p, ",")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(y, 64)
		if err != nil {
			return false
		}
		ys = append(ys, v)
	}
	if len(ys) == 0 {
		return false
	}
	lo, hi := ys[0], ys[0]
	for _, y := range ys {
		lo, hi = min(lo, y), max(hi, y)
	}
	return lo < hi
}
