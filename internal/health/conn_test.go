package health

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestRoundOnAConn: a round opens the dedicated connection, names the session and sets its
// statement_timeout at two thirds of the read timeout, reads each metric on it and publishes
// the numbers; the next round reads on the same connection.
func TestRoundOnAConn(t *testing.T) {
	log, _ := newLogger()
	srv := &fakeServer{reads: map[string]fakeRead{activeQueriesSQL: {v: 4}, "select 2.5": {v: 2.5}}}
	s := NewSampler(Options{
		Connect:  srv.connect,
		Interval: time.Second,
		Timeout:  300 * time.Millisecond,
		Metrics:  []string{vocab.MetricActiveQueries, "custom.q"},
		Queries:  map[string]string{"q": "select 2.5"},
		Logger:   log,
	})
	defer s.Close()
	for range 2 {
		if err := s.SampleOnce(context.Background()); err != nil {
			t.Fatalf("SampleOnce = %v", err)
		}
	}
	for metric, want := range map[string]float64{vocab.MetricActiveQueries: 4, "custom.q": 2.5} {
		if v, _, ok := s.Value(metric); !ok || v != want {
			t.Errorf("Value(%s) = (%v, %v), want %v", metric, v, ok, want)
		}
	}
	if got := s.Samples(); got != 4 {
		t.Errorf("Samples() = %d, want 4 (two metrics, two rounds)", got)
	}
	conns := srv.opened()
	if len(conns) != 1 {
		t.Fatalf("%d connections opened over two rounds, want 1", len(conns))
	}
	want := []any{setupSQL, ApplicationName, "200"}
	if got := conns[0].execs; len(got) != 1 || !slices.Equal(got[0], want) {
		t.Errorf("Exec calls = %q, want one: %q", got, want)
	}
	if err := s.Close(); err != nil || !conns[0].IsClosed() {
		t.Errorf("Close = %v, connection closed: %v; want it closed", err, conns[0].IsClosed())
	}
}

// TestReadFailuresOnAConn: each failure a Conn reports is published as the read's error in the
// sampler's words, never with the server's message text; a bad result or a server error keeps
// the connection, and a read that breaks it marks the rest of the round lost and reconnects
// next round.
func TestReadFailuresOnAConn(t *testing.T) {
	log, logs := newLogger()
	srv := &fakeServer{reads: map[string]fakeRead{
		"select a":        {err: ResultError{"returned 2 columns, want one number"}},
		"select b":        {err: &serverError{code: "42P01", msg: `relation "s3cr3t" does not exist`}},
		replicationLagSQL: {err: ErrNull},
	}}
	s := NewSampler(Options{
		Connect:  srv.connect,
		Interval: time.Second,
		Metrics:  []string{"custom.a", "custom.b", "custom.c", vocab.MetricReplicationLag},
		Queries:  map[string]string{"a": "select a", "b": "select b", "c": "select c"},
		Logger:   log,
	})
	defer s.Close()
	err := s.SampleOnce(context.Background())
	for _, want := range []string{
		"health: custom.a: returned 2 columns, want one number",
		"health: custom.b: server error SQLSTATE 42P01 (undefined_table)",
		"health: replication_lag: " + errLagUnknown.Problem,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("SampleOnce = %v, want an error containing %q", err, want)
		}
	}
	if v, _, ok := s.Value("custom.c"); !ok || v != 1 {
		t.Errorf("Value(custom.c) = (%v, %v), want 1 read after the others failed", v, ok)
	}
	if strings.Contains(err.Error()+logs.String(), "s3cr3t") {
		t.Errorf("the server's message text leaked:\n%v\n%s", err, logs)
	}
	if got := s.Errors(); got != 3 {
		t.Errorf("Errors() = %d, want 3", got)
	}

	// A read that breaks the connection: the rest of the round is lost, the next reconnects.
	srv.answer(map[string]fakeRead{"select a": {err: errors.New("unexpected EOF"), breaks: true}})
	s.SetMetrics([]string{"custom.a", "custom.b"}, map[string]string{"a": "select a", "b": "select b"})
	err = s.SampleOnce(context.Background())
	if err == nil || !strings.Contains(err.Error(), "health: custom.a: unexpected EOF") {
		t.Errorf("SampleOnce = %v, want custom.a's EOF", err)
	}
	if n := len(srv.opened()); n != 1 {
		t.Errorf("%d connections opened before the one that broke, want 1: bad results and server errors keep it", n)
	}
	if _, _, exceeded, stale := s.Evaluate(time.Now(), map[string]float64{"custom.b": 10}, 0, true); !exceeded || !stale {
		t.Errorf("custom.b, unread on a lost connection: exceeded=%v stale=%v, want both", exceeded, stale)
	}
	if !strings.Contains(logs.String(), `reason="last read failed: connection lost"`) {
		t.Errorf("the unread metric's staleness does not say the connection was lost:\n%s", logs)
	}
	srv.answer(nil)
	if err := s.SampleOnce(context.Background()); err != nil {
		t.Fatalf("SampleOnce after reconnecting = %v", err)
	}
	if n := len(srv.opened()); n != 2 {
		t.Errorf("%d connections opened in all, want a second after the first broke", n)
	}
}

// TestSetupFailureClosesTheConn: a connection whose session cannot be set up is closed, and the
// round fails as a failed connect does.
func TestSetupFailureClosesTheConn(t *testing.T) {
	log, _ := newLogger()
	srv := &fakeServer{execErr: &serverError{code: "25006", msg: "read-only"}}
	s := NewSampler(Options{Connect: srv.connect, Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	defer s.Close()
	err := s.SampleOnce(context.Background())
	if err == nil || err.Error() != "health: connect: server error SQLSTATE 25006 (read_only_sql_transaction)" {
		t.Errorf("SampleOnce = %v, want the setup's server error as a connect failure", err)
	}
	conns := srv.opened()
	if len(conns) != 1 || !conns[0].IsClosed() {
		t.Errorf("connections opened %d, the first closed: %v; want one, closed", len(conns), len(conns) == 1 && conns[0].IsClosed())
	}
}
