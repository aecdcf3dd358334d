package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"image"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const statusRules = `
server_cores: 2
budgets:
  - name: reporting
    mode: enforce
    max_concurrent: 1
    per_query_limit: 5s
    server_share: 0.01
    burst_limit: 2s
  - name: per-tenant
    mode: warn
    per: tenant
    server_share: 0.1
rules:
  - budget: reporting
    match: {app: reporting}
  - budget: per-tenant
    match: {app: web}
`

// statusServer serves the status handler of a connector that has run costed statements under
// two budgets and blocked one statement. The blocked statement has a literal the page must not
// show.
func statusServer(t *testing.T) (*httptest.Server, *driver.Connector) {
	t.Helper()
	c, db := openRules(t, statusRules)
	if _, err := db.Exec(`CREATE TABLE orders (id int PRIMARY KEY, tenant text, note text);
		INSERT INTO orders SELECT g, 't' || (g % 7), 'note ' || g FROM generate_series(1, 2000) g`); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	reporting := tagging.With(ctx, "app", "reporting")
	for i := range 5 {
		var n int
		if err := db.QueryRowContext(reporting, "SELECT count(*) FROM orders WHERE id > $1", i).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(tagging.With(ctx, "app", "web", "tenant", "t1"),
			"UPDATE orders SET note = $1 WHERE id = $2", "x", i+1); err != nil {
			t.Fatal(err)
		}
	}
	// 0.2 s of debt, which drains at 0.01 × 2 cores = 0.02 s/s: still owed when the tests read it.
	if _, err := db.ExecContext(reporting, "SELECT pg_sleep(0.2)"); err != nil {
		t.Fatal(err)
	}
	held, err := db.QueryContext(reporting, "SELECT id FROM orders WHERE id < $1", 10)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.ExecContext(reporting, "SELECT note FROM orders WHERE note = 'statussecret' AND id < $1", 5)
	asBlocked(t, err)
	held.Close()
	srv := httptest.NewServer(c.Handler()) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return srv, c
}

// TestStatusJSONOverHTTP reads the status as JSON with a plain HTTP client.
func TestStatusJSONOverHTTP(t *testing.T) {
	srv, _ := statusServer(t)
	req, err := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(resp.Body); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "statussecret") {
		t.Fatalf("status JSON shows a literal: %s", buf.String())
	}
	var s driver.Snapshot
	if err := json.Unmarshal(buf.Bytes(), &s); err != nil {
		t.Fatal(err)
	}
	budgets := map[string]driver.BudgetStatus{}
	for _, b := range s.Budgets {
		budgets[b.Name] = b
	}
	if r := budgets["reporting"]; r.Blocked != 1 || r.Admitted != 7 || r.Debt < 0.1 || r.Burst != 2 {
		t.Errorf("reporting %+v: want 1 blocked, 7 admitted, debt ≥ 0.1 s, burst 2s", r)
	}
	if p := budgets["per-tenant"]; p.Mode != "warn" || p.Keys != 1 {
		t.Errorf("per-tenant %+v: want warn with one key", p)
	}
	if len(s.RecentBlocks) != 1 || s.RecentBlocks[0].Query != "SELECT note FROM orders WHERE note = $2 AND id < $1" {
		t.Errorf("recent blocks %+v", s.RecentBlocks)
	}
	var found bool
	for _, p := range s.Patterns {
		if p.Query == "SELECT count(*) FROM orders WHERE id > $1" {
			found = p.Count == 5 && p.K > 0 && p.MeanCost > 0 && p.PlanCost > 0
		}
	}
	if !found {
		t.Errorf("patterns %+v: want the reporting count(*) with 5 executions, k, mean and plan cost", s.Patterns)
	}
	if s.Counters.ExplainCalls == 0 {
		t.Errorf("counters %+v: want EXPLAIN calls", s.Counters)
	}
}

// chromium returns the Chromium binary: Debian's package installs it as "chromium". Without
// it the test is skipped, except under CI=true, where .ci/run installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if pgtest.Required() {
		t.Fatal("chromium not found (apt-get install -y chromium); it is required under CI=true")
	}
	t.Skip("chromium not found (apt-get install -y chromium)")
	return ""
}

// runChromium runs headless Chromium on url with extra flags and returns its standard output.
func runChromium(t *testing.T, bin, url string, flags ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(), "--window-size=1200,900"}, flags...)
	cmd := exec.CommandContext(ctx, bin, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium %v: %v\n%s", flags, err, stderr.String())
	}
	return stdout.Bytes()
}

// TestStatusPageInChromium renders the status page in headless Chromium: the DOM Chromium
// builds must show the budgets with their blocked counts, and the screenshot (status.png in
// the test's artifact directory; keep it with go test -artifacts) must be a rendered page.
func TestStatusPageInChromium(t *testing.T) {
	bin := chromium(t)
	srv, _ := statusServer(t)

	dom := string(runChromium(t, bin, srv.URL+"/", "--dump-dom"))
	for _, want := range []string{
		`<table id="budgets">`,
		`<td class="name">reporting</td><td>enforce</td>`,
		`<td class="n blocked">1</td>`,
		`<td class="name">per-tenant</td><td>warn</td>`,
		`SELECT count(*) FROM orders WHERE id &gt; $1`,
		`SELECT note FROM orders WHERE note = $2 AND id &lt; $1`,
	} {
		if !strings.Contains(dom, want) {
			t.Errorf("Chromium's DOM lacks %s", want)
		}
	}
	if strings.Contains(dom, "statussecret") {
		t.Errorf("the page shows a literal")
	}
	if t.Failed() {
		t.Logf("DOM:\n%s", dom)
	}

	shot := filepath.Join(t.ArtifactDir(), "status.png")
	runChromium(t, bin, srv.URL+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1200 || b.Dy() != 900 {
		t.Errorf("screenshot %v, want 1200x900", b)
	}
	if colours := distinctColours(img, 64); colours < 8 {
		t.Errorf("screenshot has %d distinct colours: not a rendered page", colours)
	}
	t.Logf("screenshot: %s", shot)
}

// distinctColours counts the distinct colours in img, stopping at limit.
func distinctColours(img image.Image, limit int) int {
	seen := map[[4]uint32]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 3 {
		for x := b.Min.X; x < b.Max.X; x += 3 {
			r, g, bl, a := img.At(x, y).RGBA()
			seen[[4]uint32{r, g, bl, a}] = true
			if len(seen) >= limit {
				return len(seen)
			}
		}
	}
	return len(seen)
}
