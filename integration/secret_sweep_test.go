package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/tagging"
)

const leakRules = `
budgets:
  - name: closed
    mode: enforce
    max_concurrent: 0
  - name: slow
    mode: enforce
    max_duration: 150ms
    quarantine: {after: 1, for: 1m}
  - name: warned
    mode: warn
    max_concurrent: 0
rules:
  - budget: closed
    match: {app: closed}
  - budget: slow
    match: {app: slow}
  - budget: warned
    match: {app: warned}
guards:
  require_where: enforce
  block_truncate: enforce
`

// secretMarker is in every secret; nothing the library emits may contain it.
const secretMarker = "S3CRET"

func spanAttrText(attrs []attribute.KeyValue) string {
	var b strings.Builder
	for _, kv := range attrs {
		fmt.Fprintf(&b, "%s=%s ", kv.Key, kv.Value.String())
	}
	return b.String()
}

// TestSecretSweep runs statements carrying secrets (literals, bound values, server errors
// that quote them, guard and budget refusals, overruns, quarantine, a warn) and looks for the
// secrets in spans, metrics, debug logs, the status JSON and HTML and the Snapshot.
func TestSecretSweep(t *testing.T) {
	s := newTelSetup(t, leakRules)
	ctx := context.Background()
	tag := func(kv ...string) context.Context { return tagging.With(ctx, kv...) }
	if _, err := s.db.Exec(`CREATE TABLE users (id serial primary key, email text UNIQUE, pin int)`); err != nil {
		t.Fatal(err)
	}
	s.spans.Reset()

	var appErrs []string
	note := func(err error) {
		if err != nil {
			appErrs = append(appErrs, err.Error())
		}
	}
	// Literal and bound value.
	rows, err := s.db.QueryContext(ctx, `select * from orders where note = 'S3CRET-LIT-1' or note = $1`, "S3CRET-ARG-2")
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	// Unique violation: DETAIL quotes the value (a literal, then a bound value).
	_, err = s.db.ExecContext(ctx, `insert into users(email) values ('S3CRET-UNIQ-3@x')`)
	note(err)
	_, err = s.db.ExecContext(ctx, `insert into users(email) values ('S3CRET-UNIQ-3@x')`)
	if err == nil {
		t.Fatal("want a unique violation")
	}
	note(err)
	_, err = s.db.ExecContext(ctx, `insert into users(email) values ($1)`, "S3CRET-UNIQ-4@x")
	note(err)
	_, err = s.db.ExecContext(ctx, `insert into users(email) values ($1)`, "S3CRET-UNIQ-4@x")
	if err == nil {
		t.Fatal("want a unique violation")
	}
	note(err)
	// invalid input syntax quoting a bound value; EXPLAIN fails on it first.
	_, err = s.db.ExecContext(ctx, `select count(*) from users where pin = $1`, "S3CRET-INT-5")
	if err == nil {
		t.Fatal("want invalid input syntax")
	}
	note(err)
	// ... and quoting a literal (fails at parse analysis: EXPLAIN fails too).
	_, err = s.db.ExecContext(ctx, `select count(*) from users where pin = 'S3CRET-INT-6'`)
	if err == nil {
		t.Fatal("want invalid input syntax")
	}
	note(err)
	// A check in a transaction (EXPLAIN inside a savepoint) failing.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.ExecContext(ctx, `update users set pin = $1 where email = 'S3CRET-TX-7'`, "S3CRET-TXARG-8")
	note(err)
	tx.Rollback()
	// Guard refusal of a statement with literals.
	_, err = s.db.ExecContext(ctx, `update users set email = 'S3CRET-GUARD-9'`)
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("guard: %v", err)
	}
	note(err)
	_, err = s.db.ExecContext(ctx, `truncate users /* S3CRET-CMT-10 */`)
	note(err)
	// Budget refusal.
	_, err = s.db.ExecContext(tag("app", "closed"), `select * from users where email = 'S3CRET-BLOCK-11' and pin = $1`, "S3CRET-BLOCKARG-12")
	if !errors.As(err, &be) {
		t.Fatalf("budget: %v", err)
	}
	note(err)
	// Warn.
	_, err = s.db.ExecContext(tag("app", "warned"), `select * from users where email = 'S3CRET-WARN-13' and pin = $1`, 77)
	note(err)
	// max_duration overrun, then quarantine.
	_, err = s.db.ExecContext(tag("app", "slow"), `select pg_sleep(1), 'S3CRET-SLOW-14', $1::text`, "S3CRET-SLOWARG-15")
	if !errors.Is(err, driver.ErrOverrun) {
		t.Fatalf("overrun: %v", err)
	}
	note(err)
	_, err = s.db.ExecContext(tag("app", "slow"), `select pg_sleep(1), 'S3CRET-SLOW-16', $1::text`, "S3CRET-SLOWARG-17")
	if !errors.As(err, &be) || be.Reason != driver.ReasonQuarantine {
		t.Fatalf("quarantine: %v", err)
	}
	note(err)
	// A failure inside rows (division by zero quoting nothing, but a cast quoting a value).
	rows, err = s.db.QueryContext(ctx, `select ('S3CRET-ROW-18' || g)::int from generate_series(1, 3) g`)
	if err == nil {
		for rows.Next() {
		}
		note(rows.Err())
		rows.Close()
	} else {
		note(err)
	}
	// Prepared statement.
	st, err := s.db.PrepareContext(ctx, `select * from users where email = $1 and pin = 'S3CRET-PREP-19'`)
	if err == nil {
		_, err = st.ExecContext(ctx, "S3CRET-PREPARG-20")
		note(err)
		st.Close()
	} else {
		note(err)
	}

	for _, e := range appErrs {
		if strings.Contains(e, "BlockedError") || strings.HasPrefix(e, "pgtraffic: statement blocked") {
			if strings.Contains(e, secretMarker) {
				t.Errorf("BlockedError text holds a secret: %s", e)
			}
		}
	}

	time.Sleep(100 * time.Millisecond)
	// Spans.
	for _, sp := range s.spans.GetSpans() {
		all := sp.Name + " " + sp.Status.Description + " " + spanAttrText(sp.Attributes)
		for _, ev := range sp.Events {
			all += " event " + ev.Name + " " + spanAttrText(ev.Attributes)
		}
		for _, l := range sp.Links {
			all += spanAttrText(l.Attributes)
		}
		if strings.Contains(all, secretMarker) {
			t.Errorf("span leaks a secret: %s", all)
		}
	}
	// Metrics.
	for name, m := range s.metrics(t) {
		var sets []attribute.Set
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Sum[float64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Gauge[int64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Gauge[float64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		case metricdata.Histogram[float64]:
			for _, p := range d.DataPoints {
				sets = append(sets, p.Attributes)
			}
		}
		for _, set := range sets {
			if a := spanAttrText(set.ToSlice()); strings.Contains(a, secretMarker) {
				t.Errorf("metric %s leaks a secret: %s", name, a)
			}
		}
	}
	// Logs (debug level).
	for _, line := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(line, secretMarker) {
			t.Errorf("log leaks a secret: %s", line)
		}
	}
	// Status JSON, HTML and Snapshot.
	h := s.conn.Handler()
	for _, path := range []string{"/", "/?format=json", "/status.json"} {
		for _, accept := range []string{"application/json", "text/html"} {
			req := httptest.NewRequest("GET", path, nil)
			req.Header.Set("Accept", accept)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			body, _ := io.ReadAll(w.Result().Body)
			if strings.Contains(string(body), secretMarker) {
				t.Errorf("status %s (%s) leaks a secret: %s", path, accept, excerpt(string(body), secretMarker))
			}
		}
	}
	snap, _ := json.Marshal(s.conn.Snapshot())
	if strings.Contains(string(snap), secretMarker) {
		t.Errorf("Snapshot leaks a secret: %s", excerpt(string(snap), secretMarker))
	}
	if len(s.conn.Snapshot().Quarantines) == 0 {
		t.Errorf("no quarantine in the snapshot: the sweep did not reach it")
	}
	t.Logf("application errors (returned unchanged, fine): %q", appErrs)
}

func excerpt(s, sub string) string {
	i := strings.Index(s, sub)
	lo, hi := max(0, i-200), min(len(s), i+200)
	return s[lo:hi]
}
