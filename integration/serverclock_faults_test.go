package integration

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/cost"
	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

// TestServerClockFaults: a read that the server holds up (a lock on
// pg_stat_statements_info) ends within the reader's statement timeout, is counted and tells the
// sink that nothing is read; a killed reader connection is counted and replaced; the extension
// dropped then re-created: counted failures, then reads again, and what it teaches is the
// server's mean. The application's statements run throughout on their own connection and never
// fail.
func TestServerClockFaults(t *testing.T) {
	ctx := context.Background()
	dsn, admin, dbid := clockDB(t)
	app, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	runSleeps(t, app, 10, 0.001)
	id := sleepQueryID(t, admin, dbid)
	sink := &clockSink{ids: []cost.QueryID{{Fingerprint: 1, ID: id}}}
	r := newClockReader(t, dsn, sink)
	r.Round(ctx)
	if c := r.Counts(); c.Reads != 1 || c.Failures != 0 {
		t.Fatalf("counts %+v", c)
	}

	// A read held up by a lock.
	tx, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `lock table pg_stat_statements_info in access exclusive mode`); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	r.Round(ctx)
	took := time.Since(t0)
	tx.Rollback(ctx)
	if c := r.Counts(); c.Failures != 1 || c.Reads != 1 || sink.failed != 1 {
		t.Fatalf("a held-up read: counts %+v, sink told of %d failures", c, sink.failed)
	}
	if took > 1500*time.Millisecond {
		t.Fatalf("a held-up read took %v, want about the statement timeout %s", took, serverclock.StatementTimeout)
	}
	runSleeps(t, app, 10, 0.001)
	r.Round(ctx)
	if c := r.Counts(); c.Reads != 2 || c.Failures != 1 {
		t.Fatalf("after the lock: counts %+v", c)
	}
	sink.take()

	// The reader's connection killed.
	var killed bool
	if err := admin.QueryRow(ctx, `select bool_or(pg_terminate_backend(pid)) from pg_stat_activity where application_name = $1 and datname = current_database()`,
		serverclock.ApplicationName).Scan(&killed); err != nil || !killed {
		t.Fatalf("terminate the reader's backend: %v, %v", killed, err)
	}
	time.Sleep(100 * time.Millisecond)
	r.Round(ctx)
	r.Round(ctx)
	if c := r.Counts(); c.Failures != 2 || c.Reads != 3 {
		t.Fatalf("after the reader's connection was killed: counts %+v, want one more failure and one more read", c)
	}

	// The extension dropped, then re-created.
	if _, err := admin.Exec(ctx, `drop extension pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	runSleeps(t, app, 10, 0.001)
	r.Round(ctx)
	if c := r.Counts(); c.Failures != 3 {
		t.Fatalf("the extension dropped: counts %+v", c)
	}
	if _, err := admin.Exec(ctx, `create extension pg_stat_statements`); err != nil {
		t.Fatal(err)
	}
	runSleeps(t, app, 10, 0.004)
	r.Round(ctx)
	runSleeps(t, app, 10, 0.004)
	c0, ms0 := userCounters(t, admin, dbid, id, "postgres")
	r.Round(ctx)
	c := r.Counts()
	got := sink.take()
	t.Logf("after re-creation: counts %+v; learned %v; app entry %d calls %.1f ms", c, got, c0, ms0)
	if c.Reads != 5 {
		t.Fatalf("the extension re-created: counts %+v, want reads again", c)
	}
	if len(got) == 0 {
		t.Fatalf("nothing learned two reads after the extension was re-created")
	}
	// Every execution since the last successful read before the drop: 10 at ~1ms, 20 at ~4ms at
	// most: the mean is between 1ms and 5ms.
	last := got[len(got)-1]
	if last < 0.001 || last > 0.006 {
		t.Fatalf("learned %.3f ms a call, want the server's (1–6 ms)", last*1e3)
	}
}
