package serverclock_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pgtraffic/pgtraffic/internal/coord"
	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

// ctxConn honours its context as pgx does.
type ctxConn struct {
	mu    sync.Mutex
	reads int
}

func (c *ctxConn) Ping(ctx context.Context) error { return ctx.Err() }
func (c *ctxConn) Read(ctx context.Context, ids []int64) (serverclock.Reading, error) {
	if err := ctx.Err(); err != nil {
		return serverclock.Reading{}, err
	}
	if d, ok := ctx.Deadline(); ok && time.Until(d) < 50*time.Millisecond {
		return serverclock.Reading{}, context.DeadlineExceeded // a real read needs a round trip
	}
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return serverclock.Reading{Rows: []serverclock.Row{{QueryID: 7, Calls: 1, ExecMS: 1}}}, nil
}
func (c *ctxConn) IsClosed() bool              { return false }
func (c *ctxConn) Close(context.Context) error { return nil }

type nopSink struct{ ids []cost.QueryID }

func (s *nopSink) QueryIDs(dst []cost.QueryID, max int) []cost.QueryID   { return append(dst, s.ids...) }
func (s *nopSink) ObserveServer(uint64, int64, float64, time.Time) error { return nil }
func (s *nopSink) SetNetworkFloor(time.Duration)                         {}
func (s *nopSink) Reading(time.Time, time.Duration)                      {}
func (s *nopSink) Unidentified() uint64                                  { return 0 }

// TestReaderElectionWithoutSecret: where the role may not call pg_control_system() (the
// secret never reads), README promises each instance reads for itself. The server clock reader
// hands the election its whole round context, which keyFor spends waiting for the key.
func TestReaderElectionWithoutSecret(t *testing.T) {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never reached: keyFor comes first
	defer rc.Close()
	el, err := coord.NewElection(coord.ElectionOptions{Client: rc, Instance: "a", Database: "app@db/x",
		Secret: func(context.Context) (string, error) {
			return "", errors.New("ERROR: permission denied for function pg_control_system (SQLSTATE 42501)")
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer el.Close()
	conn := &ctxConn{}
	r := serverclock.NewReader(serverclock.Options{
		Connect:  func(context.Context) (serverclock.Conn, error) { return conn, nil },
		Sink:     &nopSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}},
		Interval: 100 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Election: el,
	})
	start := time.Now()
	for range 2 {
		r.Round(context.Background())
	}
	c := r.Counts()
	t.Logf("2 rounds took %v; counts %+v; conn reads %d", time.Since(start).Round(time.Millisecond), c, conn.reads)
	if c.Reads != 2 || c.Failures != 0 {
		t.Errorf("without the secret the reader read %d times and failed %d of 2 rounds; want it to read for itself each round", c.Reads, c.Failures)
	}
}

// TestReaderElectionHungRedis: with the secret read but Redis accepting and never
// answering, the Elect call spends the round's whole context, and the read after it fails.
func TestReaderElectionHungRedis(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	rc := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rc.Close()
	el, err := coord.NewElection(coord.ElectionOptions{Client: rc, Instance: "a", Database: "app@db/x",
		Secret: func(context.Context) (string, error) { return "7300000000000000001", nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer el.Close()
	conn := &ctxConn{}
	r := serverclock.NewReader(serverclock.Options{
		Connect:  func(context.Context) (serverclock.Conn, error) { return conn, nil },
		Sink:     &nopSink{ids: []cost.QueryID{{Fingerprint: 1, ID: 7}}},
		Interval: 100 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		Election: el,
	})
	r.Round(context.Background())
	if c := r.Counts(); c.Reads != 1 {
		t.Errorf("with Redis hung the reader's round: %+v; want it to read for itself (README: while Redis is unreachable each instance samples for itself)", c)
	}
}
