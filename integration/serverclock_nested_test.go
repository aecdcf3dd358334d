package integration

import (
	"context"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgtraffic/pgtraffic/internal/cost"
)

// TestServerClockNestedNotCounted: under pg_stat_statements.track = all, the same
// statement run nested (in a function, slow) has entries of its own (toplevel false) with the
// same query identifier; the reader counts top-level statements only, so what it learns is the
// top-level mean.
func TestServerClockNestedNotCounted(t *testing.T) {
	ctx := context.Background()
	dsn, admin, dbid := clockDB(t)
	app, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close(ctx)
	if _, err := app.Exec(ctx, `set pg_stat_statements.track = 'all'`); err != nil {
		t.Fatal(err)
	}
	nested := func(n int) {
		t.Helper()
		if _, err := app.Exec(ctx, `do $$ begin for i in 1..`+strconv.Itoa(n)+` loop execute 'select pg_sleep($1::float8) from rv' using 0.02::float8; end loop; end $$`); err != nil {
			t.Fatal(err)
		}
	}
	runSleeps(t, app, 10, 0.001)
	nested(2)
	id := sleepQueryID(t, admin, dbid)
	var nestedRows int
	if err := admin.QueryRow(ctx, `select count(*) from pg_stat_statements where dbid = $1 and queryid = $2 and not toplevel`, dbid, id).Scan(&nestedRows); err != nil {
		t.Fatal(err)
	}
	if nestedRows == 0 {
		t.Fatal("no nested entry of the statement's query identifier: the test sees nothing to leave out")
	}
	sink := &clockSink{ids: []cost.QueryID{{Fingerprint: 1, ID: id}}}
	r := newClockReader(t, dsn, sink)
	r.Round(ctx)
	c0, ms0 := userCounters(t, admin, dbid, id, "postgres")
	runSleeps(t, app, 20, 0.001)
	nested(10)
	c1, ms1 := userCounters(t, admin, dbid, id, "postgres")
	truth := (ms1 - ms0) / 1e3 / float64(c1-c0)
	r.Round(ctx)
	got := sink.take()
	t.Logf("top-level: %d calls %.1f ms (%.3f ms a call); learned %v", c1-c0, ms1-ms0, truth*1e3, got)
	if len(got) != 1 {
		t.Fatalf("learned %v, want one report", got)
	}
	if ratio := got[0] / truth; ratio < 0.75 || ratio > 1.33 {
		t.Fatalf("learned %.3f ms a call, the top-level mean is %.3f ms", got[0]*1e3, truth*1e3)
	}
}
