package health

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

func TestNewSamplerDefaults(t *testing.T) {
	tests := []struct {
		name                              string
		opts                              Options
		interval, timeout, connectTimeout time.Duration
	}{
		{"zero options", Options{}, time.Second, 500 * time.Millisecond, minConnectTimeout},
		{"interval only", Options{Interval: 200 * time.Millisecond}, 200 * time.Millisecond, 100 * time.Millisecond, minConnectTimeout},
		{"explicit timeout", Options{Interval: time.Second, Timeout: 300 * time.Millisecond}, time.Second, 300 * time.Millisecond, minConnectTimeout},
		{"long timeout bounds the connect too", Options{Interval: time.Minute, Timeout: 20 * time.Second}, time.Minute, 20 * time.Second, 20 * time.Second},
		{"negative values mean defaults", Options{Interval: -1, Timeout: -1}, time.Second, 500 * time.Millisecond, minConnectTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := NewSampler(tt.opts)
			defer s.Close()
			if s.interval != tt.interval || s.timeout != tt.timeout || s.connectTimeout != tt.connectTimeout {
				t.Errorf("interval, timeout, connect timeout = %v, %v, %v; want %v, %v, %v",
					s.interval, s.timeout, s.connectTimeout, tt.interval, tt.timeout, tt.connectTimeout)
			}
			if s.log == nil || s.now == nil {
				t.Error("logger or clock not defaulted")
			}
		})
	}
}

func TestSetMetrics(t *testing.T) {
	log, logs := newLogger()
	s := NewSampler(Options{
		Metrics: []string{vocab.MetricActiveQueries, "custom.a", "custom.b"},
		Queries: map[string]string{"a": "select 1", "b": "select 2"},
		Logger:  log,
	})
	defer s.Close()
	seed(t, s, vocab.MetricActiveQueries, 3, t0)
	seed(t, s, "custom.a", 1, t0)
	seed(t, s, "custom.b", 2, t0)

	// Reload: custom.a keeps its query, custom.b's changes, replication_lag is
	// new, active_queries goes; two names cannot be read.
	s.SetMetrics(
		[]string{"custom.a", "custom.b", vocab.MetricReplicationLag, vocab.MetricInFlight, "custom.missing", "load_average"},
		map[string]string{"a": "select 1", "b": "select 3"},
	)
	if got, want := s.config().order, []string{"custom.a", "custom.b", vocab.MetricReplicationLag}; !slices.Equal(got, want) {
		t.Errorf("sampled metrics = %v, want %v", got, want)
	}
	for _, tt := range []struct {
		metric string
		ok     bool
		v      float64
	}{
		{"custom.a", true, 1},                  // same query: the reading survives
		{"custom.b", true, 2},                  // a new query: the reading stands until it is read
		{vocab.MetricActiveQueries, false, 0},  // no longer configured
		{vocab.MetricReplicationLag, false, 0}, // not read yet
	} {
		if v, _, ok := s.Value(tt.metric); ok != tt.ok || v != tt.v {
			t.Errorf("Value(%s) = (%v, %v), want (%v, %v)", tt.metric, v, ok, tt.v, tt.ok)
		}
	}
	if metric, _, exceeded, stale := s.Evaluate(t0, map[string]float64{"custom.b": 2}, 0, true); metric != "custom.b" || !exceeded || stale {
		t.Errorf("custom.b at its threshold, its query changed: Evaluate = (%q, exceeded %v, stale %v), want it exceeded, not stale",
			metric, exceeded, stale)
	}
	if got := s.Errors(); got != 2 {
		t.Errorf("Errors() = %d, want 2 (two metrics that cannot be read)", got)
	}
	for _, want := range []string{`metric=custom.missing error="no query named \"missing\" under health_queries"`, `metric=load_average error="unknown metric"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs)
		}
	}
	_, _, exceeded, stale := s.Evaluate(t0, map[string]float64{"custom.missing": 1}, 0, true)
	if !exceeded || !stale {
		t.Errorf("unreadable metric: exceeded=%v stale=%v, want both", exceeded, stale)
	}
	if !strings.Contains(logs.String(), `reason="last read failed: no query named`) {
		t.Errorf("staleness of an unreadable metric does not say why:\n%s", logs)
	}

	// A result of a round that raced with the reload is dropped; the new query's is published.
	s.publish([]result{{metric: "custom.b", sql: "select 2", value: 9, at: t0.Add(time.Second)}})
	if v, _, _ := s.Value("custom.b"); v != 2 {
		t.Errorf("Value(custom.b) = %v after a result of its old query; want 2, the result dropped", v)
	}
	seed(t, s, "custom.b", 3, t0.Add(time.Second))
	if v, _, _ := s.Value("custom.b"); v != 3 {
		t.Errorf("Value(custom.b) = %v after a result of its new query; want 3", v)
	}
}

func TestConnectFailure(t *testing.T) {
	log, logs := newLogger()
	clock := fakeclock.New()
	var dials atomic.Int32
	boom := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	s := NewSampler(Options{
		Connect: func(ctx context.Context) (Conn, error) {
			dials.Add(1)
			if _, ok := ctx.Deadline(); !ok {
				t.Error("connect context has no deadline")
			}
			return nil, boom
		},
		Interval: time.Second,
		Metrics:  []string{vocab.MetricActiveQueries, vocab.MetricReplicationLag},
		Logger:   log,
		Now:      clock.Now,
	})
	defer s.Close()

	err := s.SampleOnce(context.Background())
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "health: connect: ") {
		t.Fatalf("SampleOnce = %v, want the connect error prefixed with health: connect:", err)
	}
	if _, _, exceeded, stale := s.Evaluate(clock.Now(), map[string]float64{vocab.MetricActiveQueries: 8}, 0, true); !exceeded || !stale {
		t.Errorf("after a failed connect: exceeded=%v stale=%v, want both", exceeded, stale)
	}
	if !strings.Contains(logs.String(), `reason="last read failed: not connected"`) {
		t.Errorf("staleness does not say the sampler is not connected:\n%s", logs)
	}

	// The loop's rounds wait out the backoff (at least half an interval)...
	if _, err := s.round(context.Background(), false); !errors.Is(err, errWaiting) {
		t.Errorf("round during backoff = %v, want errWaiting", err)
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("%d dials during backoff, want 1", n)
	}
	// ...then try again; SampleOnce does not wait.
	clock.Advance(time.Second)
	if _, err := s.round(context.Background(), false); !errors.Is(err, boom) {
		t.Errorf("round after backoff = %v, want the connect error", err)
	}
	if err := s.SampleOnce(context.Background()); !errors.Is(err, boom) {
		t.Errorf("SampleOnce = %v, want the connect error", err)
	}
	if n := dials.Load(); n != 3 {
		t.Errorf("%d dials, want 3", n)
	}
	if got := s.Errors(); got != 3 {
		t.Errorf("Errors() = %d, want 3", got)
	}
	if n := logs.count("connect failed"); n != 1 {
		t.Errorf("the same connect error was logged %d times, want once:\n%s", n, logs)
	}
	if s.sess.t.failures != 3 {
		t.Errorf("consecutive failures = %d, want 3", s.sess.t.failures)
	}
}

func TestNilConnect(t *testing.T) {
	log, _ := newLogger()
	s := NewSampler(Options{Metrics: []string{vocab.MetricActiveQueries}, Logger: log})
	defer s.Close()
	if err := s.SampleOnce(context.Background()); err == nil || !strings.Contains(err.Error(), "Options.Connect is nil") {
		t.Errorf("SampleOnce without Connect = %v", err)
	}
}

func TestOpensNothingWithoutMetrics(t *testing.T) {
	var dials atomic.Int32
	log, _ := newLogger()
	s := NewSampler(Options{
		Connect: func(context.Context) (Conn, error) {
			dials.Add(1)
			return nil, errors.New("should not dial")
		},
		Metrics: []string{vocab.MetricInFlight}, // not sampled
		Logger:  log,
	})
	s.Start()
	s.Start() // idempotent
	if err := s.SampleOnce(context.Background()); err != nil {
		t.Errorf("SampleOnce with nothing to read = %v", err)
	}
	s.SetMetrics(nil, nil)
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v", err)
	}
	if n := dials.Load(); n != 0 {
		t.Errorf("%d dials with no metric configured, want 0", n)
	}
	if err := s.SampleOnce(context.Background()); !errors.Is(err, errClosed) {
		t.Errorf("SampleOnce after Close = %v, want errClosed", err)
	}
	s.Start() // no-op after Close
}

func TestLoopDialsAndCloseStopsIt(t *testing.T) {
	log, _ := newLogger()
	dialed := make(chan struct{}, 1)
	s := NewSampler(Options{
		Connect: func(ctx context.Context) (Conn, error) {
			select {
			case dialed <- struct{}{}:
			default:
			}
			<-ctx.Done() // a connect that hangs until Close cancels it
			return nil, ctx.Err()
		},
		Interval: time.Hour, // only the start-up round can dial
		Metrics:  []string{vocab.MetricActiveQueries},
		Logger:   log,
	})
	s.Start()
	<-dialed
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if got := s.Errors(); got != 0 {
		t.Errorf("Errors() = %d after a connect canceled by Close, want 0", got)
	}
}
