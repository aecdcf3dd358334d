package driver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// statusFixture runs a few statements through a harness: two costed ones (so the pattern
// table has an entry), one held reporting query and one reporting query blocked behind it.
// The blocked statement has a literal and a "<" that the HTML page must escape.
func statusFixture(t *testing.T) *telHarness {
	t.Helper()
	h := newTelHarness(t, telRules)
	costed := tagging.With(context.Background(), "app", "costed")
	for range 2 {
		if _, err := h.db.ExecContext(costed, "SELECT 1 FROM items WHERE id = $1", 1); err != nil {
			t.Fatal(err)
		}
	}
	reporting := tagging.With(context.Background(), "app", "reporting")
	release := h.hold(t, reporting)
	t.Cleanup(release)
	_, err := h.db.ExecContext(reporting, "SELECT 1 FROM orders WHERE note = 'topsecret' AND id < $1", 9)
	if !errors.Is(err, ErrBlocked) {
		t.Fatalf("want a block, got %v", err)
	}
	return h
}

func statusGet(t *testing.T, h http.Handler, method, target, accept string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return w.Result()
}

func TestStatusJSON(t *testing.T) {
	h := statusFixture(t)
	srv := httptest.NewServer(h.conn.Handler())
	defer srv.Close()

	for _, tt := range []struct{ name, path, accept string }{
		{"accept header", "/", "application/json"},
		{"format parameter", "/?format=json", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodGet, srv.URL+tt.path, nil)
			if tt.accept != "" {
				req.Header.Set("Accept", tt.accept)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
				t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if cc := resp.Header.Get("Cache-Control"); cc != "no-store" {
				t.Errorf("Cache-Control %q, want no-store", cc)
			}
			body, _ := io.ReadAll(resp.Body)
			if strings.Contains(string(body), "topsecret") {
				t.Fatalf("JSON contains a literal: %s", body)
			}
			var s Snapshot
			if err := json.Unmarshal(body, &s); err != nil {
				t.Fatal(err)
			}
			byName := map[string]BudgetStatus{}
			for _, b := range s.Budgets {
				byName[b.Name] = b
			}
			if r := byName["reporting"]; r.Mode != "enforce" || r.Blocked != 1 || r.InFlight != 1 || r.Admitted != 1 {
				t.Errorf("reporting: %+v, want enforce, 1 blocked, 1 in flight, 1 admitted", r)
			}
			if len(s.Budgets) != 3 || s.InFlight != 1 {
				t.Errorf("%d budgets, %d in flight; want 3 and 1", len(s.Budgets), s.InFlight)
			}
			if len(s.RecentBlocks) != 1 || s.RecentBlocks[0].Budget != "reporting" || s.RecentBlocks[0].Reason != ReasonConcurrency ||
				s.RecentBlocks[0].Query != "SELECT $2 FROM orders WHERE note = $3 AND id < $1" {
				t.Errorf("recent blocks: %+v", s.RecentBlocks)
			}
			if len(s.Patterns) != 1 || s.Patterns[0].Count != 2 || s.Patterns[0].Query != "SELECT $2 FROM items WHERE id = $1" || len(s.Patterns[0].Fingerprint) != 16 {
				t.Errorf("patterns: %+v, want SELECT $2 FROM items ... counted twice", s.Patterns)
			}
			if s.Counters.Blocked != 1 || s.Counters.PatternMisses == 0 || s.Counters.Reloads != 1 {
				t.Errorf("counters: %+v", s.Counters)
			}
		})
	}
}

func TestStatusJSONEmptyLists(t *testing.T) {
	h := newTelHarness(t, "")
	resp := statusGet(t, h.conn.Handler(), http.MethodGet, "/?format=json", "")
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{`"budgets": []`, `"patterns": []`, `"recent_blocks": []`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("JSON lacks %s:\n%s", want, body)
		}
	}
}

func TestStatusHTML(t *testing.T) {
	h := statusFixture(t)
	resp := statusGet(t, h.conn.Handler(), http.MethodGet, "/", "text/html")
	body, _ := io.ReadAll(resp.Body)
	page := string(body)
	if ct := resp.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("content type %q", ct)
	}
	for _, want := range []string{
		`<td class="name">reporting</td><td>enforce</td>`,
		`<td class="n blocked">1</td>`,
		`SELECT $2 FROM items WHERE id = $1`,
		`SELECT $2 FROM orders WHERE note = $3 AND id &lt; $1`, // escaped by html/template
		`<td class="n">2</td>`,                                 // the pattern's count
		`<td class="reason">concurrency</td>`,
		`<span class="blocked-by" data-reason="concurrency">blocked concurrency: 1</span>`,
		`<svg class="chart"`,
		`<table id="quarantines">`,
		`<table id="rule-expiries">`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	if strings.Contains(page, "topsecret") || strings.Contains(page, "id < $1") {
		t.Errorf("page shows a literal or unescaped text:\n%s", page)
	}
}

func TestStatusHTMLEmpty(t *testing.T) {
	h := newTelHarness(t, "")
	resp := statusGet(t, h.conn.Handler(), http.MethodGet, "/", "")
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{"no budgets in force", "no costed statements yet", "0 budgets"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("empty page lacks %q", want)
		}
	}
}

func TestStatusMethods(t *testing.T) {
	h := newTelHarness(t, "")
	for _, tt := range []struct {
		method string
		code   int
	}{
		{http.MethodGet, http.StatusOK},
		{http.MethodHead, http.StatusOK},
		{http.MethodPost, http.StatusMethodNotAllowed},
		{http.MethodDelete, http.StatusMethodNotAllowed},
	} {
		t.Run(tt.method, func(t *testing.T) {
			resp := statusGet(t, h.conn.Handler(), tt.method, "/", "")
			if resp.StatusCode != tt.code {
				t.Fatalf("%s: %d, want %d", tt.method, resp.StatusCode, tt.code)
			}
			if tt.code == http.StatusMethodNotAllowed && resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("Allow %q", resp.Header.Get("Allow"))
			}
		})
	}
}

// nonFiniteSnapshot holds NaN and ±Inf wherever a Snapshot has a float, as a corrupt shared
// state could put them there.
func nonFiniteSnapshot() Snapshot {
	nan, inf := math.NaN(), math.Inf(1)
	return Snapshot{
		Budgets: []BudgetStatus{{Name: "b", Debt: nan, MaxDebt: inf, Burst: -inf,
			Shared: &SharedStatus{Rate: nan, Burst: inf, GlobalDebt: -inf}}},
		Patterns:     []PatternStatus{{Fingerprint: "f", MeanCost: nan, PlanCost: inf, K: -inf}},
		RecentBlocks: []BlockStatus{},
	}
}

// The handler renders a response whole before writing it: a snapshot it cannot encode is a
// 500 with a short message, never a 200 with an empty or partial body.
func TestStatusUnencodableIsAnError(t *testing.T) {
	h := statusHandler(nonFiniteSnapshot)
	resp := statusGet(t, h, http.MethodGet, "/?format=json", "")
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusInternalServerError {
		t.Fatalf("status %d with body %q, want 500", resp.StatusCode, body)
	}
	if len(body) == 0 || len(body) > 100 || strings.Contains(string(body), "NaN") {
		t.Errorf("error body %q: want a short message that quotes nothing", body)
	}
}

// Connector.Snapshot's numbers are made finite, so its JSON encodes.
func TestSnapshotFinite(t *testing.T) {
	s := nonFiniteSnapshot()
	s.finite()
	js, err := json.Marshal(s)
	if err != nil {
		t.Fatalf("a finite snapshot does not encode: %v", err)
	}
	b, p := s.Budgets[0], s.Patterns[0]
	for _, v := range []float64{b.Debt, b.MaxDebt, b.Burst, b.Shared.Rate, b.Shared.Burst, b.Shared.GlobalDebt,
		p.MeanCost, p.PlanCost, p.K} {
		if v != 0 {
			t.Errorf("a non-finite number became %v, want 0 (%s)", v, js)
		}
	}
	resp := statusGet(t, statusHandler(func() Snapshot { return s }), http.MethodGet, "/", "application/json")
	var back Snapshot
	if err := json.NewDecoder(resp.Body).Decode(&back); resp.StatusCode != http.StatusOK || err != nil {
		t.Fatalf("status %d, decode: %v", resp.StatusCode, err)
	}
}

// A budget's chart prints its scale (the most decisions of a kind in one interval), shows a
// small count beside a large one, and draws debt only for a budget with a bucket: without
// one, debt never drains.
func TestStatusChart(t *testing.T) {
	history := make([]SampleStatus, 30)
	for i := range history {
		history[i] = SampleStatus{Debt: 0.5, DebtRead: true}
	}
	history[28].Blocked, history[29].Admitted = 2445, 7
	for _, tt := range []struct {
		burst    float64
		wantDebt bool
	}{{0, false}, {1, true}} {
		c := budgetChart(BudgetStatus{Burst: tt.burst, History: history})
		if c.Peak != 2445 {
			t.Errorf("burst %v: peak %d, want 2445", tt.burst, c.Peak)
		}
		// 7 admissions beside 2445 refusals are a hair's height: they are drawn a stroke high.
		last := c.Admitted[strings.LastIndex(strings.TrimSpace(c.Admitted), " ")+1:]
		if !strings.HasSuffix(last, ",45.0 ") {
			t.Errorf("burst %v: the last admitted point %q, want 2 above the baseline (47)", tt.burst, last)
		}
		if (c.Debt != "") != tt.wantDebt || strings.Contains(c.Label, "debt") != tt.wantDebt {
			t.Errorf("burst %v: debt points %q, label %q; want a debt line: %v", tt.burst, c.Debt, c.Label, tt.wantDebt)
		}
	}
	var page strings.Builder
	if err := statusPage.Execute(&page, Snapshot{Budgets: []BudgetStatus{{Name: "b", Debt: 7.5, History: history}}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(page.String(), `<text class="peak" x="4" y="11">max 2445</text>`) ||
		strings.Contains(page.String(), "7.5s") {
		t.Errorf("page: want the chart's scale and no debt for a budget without a bucket:\n%s", page.String())
	}
}
