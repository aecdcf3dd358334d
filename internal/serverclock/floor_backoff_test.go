package serverclock

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// slowStartConn is a server without pg_stat_statements whose round trips are slow while slow is
// set (a deploy under load, a network blip) and fast after.
type slowStartConn struct {
	slow atomic.Bool
}

func (c *slowStartConn) Ping(context.Context) error {
	if c.slow.Load() {
		time.Sleep(15 * time.Millisecond)
	}
	return nil
}
func (c *slowStartConn) Read(context.Context, []int64) (Reading, error) {
	return Reading{}, ErrUnavailable
}
func (c *slowStartConn) IsClosed() bool              { return false }
func (c *slowStartConn) Close(context.Context) error { return nil }

// TestFloorKeepsItsScheduleWithoutTheExtension: without pg_stat_statements the client's clock,
// less the network floor, is what every statement is charged, and the reader waits the longest
// backoff (64 intervals) between its attempts to read the extension. The round trips that make
// the floor must keep their own schedule meanwhile: round trips measured slow at the start (a
// deploy under load) must not stay the floor for a minute, taking most of every short
// statement's time off it.
func TestFloorKeepsItsScheduleWithoutTheExtension(t *testing.T) {
	conn := &slowStartConn{}
	conn.slow.Store(true)
	sink := &fakeSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}}
	r := NewReader(Options{Connect: func(context.Context) (Conn, error) { return conn, nil }, Sink: sink,
		Interval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: time.Now})
	r.Start()
	for deadline := time.Now().Add(10 * time.Second); r.Counts().Failures == 0; { // the first round
		if time.Now().After(deadline) {
			t.Fatal("the first round never failed to read the extension")
		}
		time.Sleep(time.Millisecond)
	}
	conn.slow.Store(false)
	time.Sleep(300 * time.Millisecond) // 30 intervals; the next read is due after 64
	r.Close()
	t.Logf("floor %v after 30 intervals of fast round trips", sink.floor)
	if sink.floor >= 10*time.Millisecond {
		t.Errorf("the floor is still %v, the slow round trips of the first round: none measured during the read's backoff", sink.floor)
	}
}
