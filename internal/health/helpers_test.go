package health

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/fakeclock"
)

// logBuffer captures a logger's output for assertions; safe for concurrent use.
type logBuffer struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// count returns how many logged lines contain sub.
func (l *logBuffer) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for line := range strings.Lines(l.buf.String()) {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func newLogger() (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

var t0 = fakeclock.Start // where every fake clock starts

// seed publishes a good reading of metric, as a round would.
func seed(tb testing.TB, s *Sampler, metric string, v float64, at time.Time) {
	tb.Helper()
	sql, ok := s.config().defs[metric]
	if !ok {
		tb.Fatalf("seed: %s is not configured", metric)
	}
	s.publish([]result{{metric: metric, sql: sql, value: v, at: at}})
}

// fail publishes a failed read of metric, as a round would.
func fail(tb testing.TB, s *Sampler, metric, why string) {
	tb.Helper()
	sql, ok := s.config().defs[metric]
	if !ok {
		tb.Fatalf("fail: %s is not configured", metric)
	}
	s.publish([]result{{metric: metric, sql: sql, err: why, report: true}})
}

// serverError is a server's refusal as a Conn reports it: a SQLSTATE, and a message that can
// quote the query's literals.
type serverError struct{ code, msg string }

func (e *serverError) Error() string    { return "ERROR: " + e.msg + " (SQLSTATE " + e.code + ")" }
func (e *serverError) SQLState() string { return e.code }

// fakeConn is a Conn that its server answers; safe for concurrent use.
type fakeConn struct {
	srv *fakeServer

	mu     sync.Mutex // protects the fields below
	execs  [][]any    // each Exec's sql and args
	closed bool
}

// fakeRead is the answer to one query; breaks closes the connection, as a client-side timeout
// or a terminated backend does.
type fakeRead struct {
	v      float64
	err    error
	breaks bool
	// took is how long the read takes, on the server's clock (fakeServer.clock), which it
	// moves on: a read that times out takes its timeout.
	took time.Duration
}

func (c *fakeConn) Exec(_ context.Context, sql string, args ...any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.execs = append(c.execs, append([]any{sql}, args...))
	return c.srv.execErr
}

func (c *fakeConn) ReadNumber(_ context.Context, sql string) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, errors.New("conn closed")
	}
	r := c.srv.read(sql)
	if r.took > 0 {
		c.srv.clock.Advance(r.took)
	}
	c.closed = r.breaks
	return r.v, r.err
}

func (c *fakeConn) IsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *fakeConn) Close(context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

// fakeServer opens fakeConns, whose Exec returns execErr and whose reads it answers by their
// SQL from reads (a query not in reads returns 1); safe for concurrent use.
type fakeServer struct {
	execErr error
	clock   *fakeclock.Clock // moved on by a read that takes time (fakeRead.took)

	mu    sync.Mutex // protects the fields below
	reads map[string]fakeRead
	conns []*fakeConn
}

// answer makes reads the answers to the queries from now on.
func (f *fakeServer) answer(reads map[string]fakeRead) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads = reads
}

func (f *fakeServer) read(sql string) fakeRead {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r, ok := f.reads[sql]; ok {
		return r
	}
	return fakeRead{v: 1}
}

func (f *fakeServer) connect(ctx context.Context) (Conn, error) {
	if _, ok := ctx.Deadline(); !ok {
		return nil, errors.New("connect context has no deadline")
	}
	c := &fakeConn{srv: f}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.conns = append(f.conns, c)
	return c, nil
}

// opened returns the connections opened so far.
func (f *fakeServer) opened() []*fakeConn {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.conns)
}
