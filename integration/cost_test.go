package integration

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"net"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// wireLog records every byte pgtraffic's connections write to the server, so a test can prove
// what was sent and what was not. The query text of a Parse or Query message appears verbatim.
// It is safe for concurrent use; the zero value is ready.
type wireLog struct {
	mu  sync.Mutex // protects buf
	buf bytes.Buffer
}

// option makes the connector's pgx connections dial through the log.
func (w *wireLog) option() driver.Option {
	return driver.WithPgxOptions(stdlib.OptionBeforeConnect(func(_ context.Context, cc *pgx.ConnConfig) error {
		cc.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &recordingConn{Conn: nc, log: w}, nil
		}
		return nil
	}))
}

// offset returns how many bytes have been written so far, for since.
func (w *wireLog) offset() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Len()
}

// since returns a copy of the bytes written after offset off.
func (w *wireLog) since(off int) []byte {
	w.mu.Lock()
	defer w.mu.Unlock()
	return bytes.Clone(w.buf.Bytes()[off:])
}

type recordingConn struct {
	net.Conn
	log *wireLog
}

func (c *recordingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.log.mu.Lock()
	c.log.buf.Write(b[:n])
	c.log.mu.Unlock()
	return n, err
}

// openRecorded opens pgtraffic on dsn with rules, recording its wire traffic, with a single
// connection so that every statement shares one backend (and one pinned *sql.Conn is all there is).
func openRecorded(t *testing.T, dsn, rules string) (*driver.Connector, *sql.DB, *wireLog) {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	wire := &wireLog{}
	// Blocks are logged at warn level; keep them out of the test output.
	c, err := driver.NewConnector(dsn, driver.WithConfig(cfg), wire.option(), driver.WithLogger((&lockedBuffer{}).logger()))
	if err != nil {
		t.Fatal(err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return c, db, wire
}

// openRaw opens plain pgx on dsn, for set-up and for looking at the server from outside pgtraffic.
func openRaw(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	return raw
}

func mustExec(t *testing.T, q interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}, ctx context.Context, query string, args ...any) {
	t.Helper()
	if _, err := q.ExecContext(ctx, query, args...); err != nil {
		t.Fatalf("%.60s: %v", query, err)
	}
}

func queryInt(t *testing.T, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, ctx context.Context, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := q.QueryRowContext(ctx, query, args...).Scan(&n); err != nil {
		t.Fatalf("%.60s: %v", query, err)
	}
	return n
}

// TestNeverSeenCrossJoinBlocked checks that a statement never seen before (no history of its
// own) whose plan is enormous, a cross join of two 200k-row tables, is blocked by a 2s
// per_query_limit before the server runs it. Its EXPLAIN plans it without executing it. Three
// observations prove that the statement itself never ran: the client sent its text only inside
// EXPLAIN; the volatile function in its WHERE clause, which inserts a row on every call, left no
// row; and the server counted no scan of either table. A cheap statement of the same shape, which
// is admitted and runs, moves both server-side observations, so they would have seen a run.
func TestNeverSeenCrossJoinBlocked(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw := openRaw(t, dsn)
	for _, q := range []string{
		`create table big_a (id int not null, v text not null)`,
		`create table big_b (id int not null, v text not null)`,
		`insert into big_a select g, md5(g::text) from generate_series(1, 200000) g`,
		`insert into big_b select id, v from big_a`,
		`analyze big_a, big_b`,
		`create table marks (id bigint generated always as identity)`,
		// Volatile, so the planner neither inlines nor pre-evaluates it: only execution calls it.
		`create function pgtraffic_mark() returns bool volatile language sql
			as 'insert into marks default values returning true'`,
	} {
		mustExec(t, raw, ctx, q)
	}

	c, db, wire := openRecorded(t, dsn, `
budgets:
  - {name: interactive, mode: enforce, per_query_limit: 2s}
rules:
  - {budget: interactive, match: {app: web}}
`)
	conn, err := db.Conn(ctx) // connected before any timing
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	web := tagging.With(ctx, "app", "web")

	// Ordinary traffic first, so that the global k the new pattern starts from is learned from
	// real executions rather than the built-in default.
	for i := range 5 {
		queryInt(t, conn, web, `select count(*) from big_a where id <= $1`, (i+1)*1000)
	}
	seqScans := func() (a, b int64) {
		t.Helper()
		// Flush the statistics of pgtraffic's backend (its next report is forced) before reading.
		// Backends report their counters when idle, at most once a second unless forced, and
		// parallel workers when they exit: force both connections' reports, then read until two
		// readings more than a second apart agree.
		mustExec(t, conn, ctx, `select pg_stat_force_next_flush()`)
		mustExec(t, raw, ctx, `select pg_stat_force_next_flush()`)
		read := func() (int64, int64) {
			return queryInt(t, raw, ctx, `select seq_scan from pg_stat_user_tables where relname = 'big_a'`),
				queryInt(t, raw, ctx, `select seq_scan from pg_stat_user_tables where relname = 'big_b'`)
		}
		a, b = read()
		for range 8 {
			time.Sleep(1100 * time.Millisecond)
			a2, b2 := read()
			if a2 == a && b2 == b {
				break
			}
			a, b = a2, b2
		}
		return a, b
	}
	scanA, scanB := seqScans()

	const crossJoin = `select count(*) from big_a a cross join big_b b where pgtraffic_mark()`
	off := wire.offset()
	for i, call := range []struct {
		name string
		run  func() error
	}{
		{"Exec", func() error { _, err := conn.ExecContext(web, crossJoin); return err }},
		{"Query", func() error {
			rows, err := conn.QueryContext(web, crossJoin)
			if err == nil {
				rows.Close()
			}
			return err
		}},
	} {
		start := time.Now()
		err := call.run()
		took := time.Since(start)
		be := asBlocked(t, err)
		if be.Reason != driver.ReasonPerQuery || be.Budget != "interactive" {
			t.Fatalf("%s: blocked for %q by %q, want per_query_limit by interactive", call.name, be.Reason, be.Budget)
		}
		// Timing is logged, not asserted: this machine is shared. The first decision includes the
		// pattern's parse and one EXPLAIN; the second hits the pattern and plan caches.
		t.Logf("decision %d (%s) took %v: %v", i+1, call.name, took, be)
	}
	sent := wire.since(off)
	inExplain := bytes.Count(sent, []byte("EXPLAIN (VERBOSE, FORMAT JSON) "+crossJoin))
	if total := bytes.Count(sent, []byte(crossJoin)); total == 0 || total != inExplain {
		t.Fatalf("the statement went on the wire %d times, %d of them inside EXPLAIN", total, inExplain)
	}
	if n := queryInt(t, raw, ctx, `select count(*) from marks`); n != 0 {
		t.Fatalf("the blocked statement ran: %d marks", n)
	}
	if a, b := seqScans(); a != scanA || b != scanB {
		t.Fatalf("the blocked statement scanned: seq_scan big_a %d -> %d, big_b %d -> %d", scanA, a, scanB, b)
	}
	if st := budgetStatus(t, c, "interactive"); st.Blocked != 2 || st.InFlight != 0 {
		t.Fatalf("budget: %d blocked, %d in flight; want 2 and 0", st.Blocked, st.InFlight)
	}

	// The control: the same shape restricted to two rows of each table is cheap, admitted and run,
	// and both observations move.
	queryInt(t, conn, web, `select count(*) from big_a a cross join big_b b
		where a.id <= 2 and b.id <= 2 and pgtraffic_mark()`)
	if n := queryInt(t, raw, ctx, `select count(*) from marks`); n == 0 {
		t.Fatal("the control statement left no mark: the marks would not show a run")
	}
	if a, b := seqScans(); a <= scanA || b <= scanB {
		t.Fatalf("the control statement's scans were not counted: big_a %d -> %d, big_b %d -> %d", scanA, a, scanB, b)
	}
}

// costTxRules route the test's statements to a budget that needs a cost for every statement
// (server_share) and explains every call, so EXPLAIN runs inside the caller's transactions.
const costTxRules = `
budgets:
  - {name: ledger, mode: enforce, server_share: 1, burst_limit: 1000s, explain: call}
rules:
  - {budget: ledger, match: {app: ledger}}
`

func createLedger(t *testing.T, raw *sql.DB) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{
		`create table accounts (id int primary key, balance int not null)`,
		`insert into accounts values (1, 100), (2, 50)`,
		`create table ledger (id int generated always as identity primary key, note text not null)`,
		`create table docs (id int primary key, body jsonb not null)`,
	} {
		mustExec(t, raw, ctx, q)
	}
}

// TestTransactionUnderCostBudget checks that a transaction with multi-statement strings, the
// caller's savepoints (one of them named like pgtraffic's own), row locks and a statement whose
// EXPLAIN fails, run under a budget that needs a cost, commits exactly what it should.
func TestTransactionUnderCostBudget(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw := openRaw(t, dsn)
	createLedger(t, raw)
	c, db, wire := openRecorded(t, dsn, costTxRules)
	lg := tagging.With(ctx, "app", "ledger")

	off := wire.offset()
	tx, err := db.BeginTx(lg, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Several statements in one string: not explainable (EXPLAIN takes one), so sent unexplained.
	const multi = `insert into ledger (note) values ('a'); insert into ledger (note) values ('b')`
	mustExec(t, tx, lg, multi)

	// The caller's savepoint and rollback undo the explained insert between them.
	mustExec(t, tx, lg, `savepoint s1`)
	mustExec(t, tx, lg, `insert into accounts values ($1, $2)`, 3, 7)
	mustExec(t, tx, lg, `rollback to savepoint s1`)

	// Row locks taken by the caller's statements stay held until COMMIT.
	if bal := queryInt(t, tx, lg, `select balance from accounts where id = $1 for update`, 1); bal != 100 {
		t.Fatalf("balance %d", bal)
	}
	mustExec(t, tx, lg, `update accounts set balance = balance - $1 where id = $2`, 30, 1)
	mustExec(t, tx, lg, `update accounts set balance = balance + $1 where id = $2`, 30, 2)
	var pgErr *pgconn.PgError
	_, err = raw.ExecContext(ctx, `select 1 from accounts where id = 1 for update nowait`)
	if !errors.As(err, &pgErr) || pgErr.Code != "55P03" {
		t.Fatalf("another session could lock the row the transaction locked: %v", err)
	}

	// A caller's savepoint named like pgtraffic's is shadowed only between pgtraffic's SAVEPOINT
	// and RELEASE: the caller's ROLLBACK TO still returns to the caller's.
	mustExec(t, tx, lg, `savepoint pgtraffic_explain`)
	mustExec(t, tx, lg, `insert into ledger (note) values ($1)`, "undone")
	mustExec(t, tx, lg, `rollback to savepoint pgtraffic_explain`)

	// EXPLAIN fails here while the statement succeeds: EXPLAIN sends the []byte argument with
	// no type, as bytea text, which jsonb rejects (22P02); the prepared statement sends it as
	// jsonb. The failed EXPLAIN must not abort the transaction.
	failuresBefore := c.Snapshot().Counters.ExplainFailures
	mustExec(t, tx, lg, `insert into docs values ($1, $2)`, 1, []byte(`{"k": 1}`))
	if c.Snapshot().Counters.ExplainFailures == failuresBefore {
		t.Fatal("the jsonb insert's EXPLAIN did not fail; the test no longer covers a failing EXPLAIN")
	}
	mustExec(t, tx, lg, `insert into ledger (note) values ($1)`, "c")
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}

	sent := wire.since(off)
	if !bytes.Contains(sent, []byte(multi)) || bytes.Contains(sent, []byte("EXPLAIN (VERBOSE, FORMAT JSON) "+multi)) {
		t.Error("the multi-statement string was not sent exactly as given, unexplained")
	}
	for _, want := range []string{
		"EXPLAIN (VERBOSE, FORMAT JSON) insert into accounts values ($1, $2)",
		"EXPLAIN (VERBOSE, FORMAT JSON) select balance from accounts where id = $1 for update",
		"SAVEPOINT pgtraffic_explain", "RELEASE SAVEPOINT pgtraffic_explain",
	} {
		if !bytes.Contains(sent, []byte(want)) {
			t.Errorf("no %q on the wire: the budget did not explain inside the transaction", want)
		}
	}
	// Every EXPLAIN's savepoint is rolled back in its pipeline (the locks it took go), and only
	// the jsonb insert's EXPLAIN failed: the one recovery sent after it.
	opened := bytes.Count(sent, []byte("\x00SAVEPOINT pgtraffic_explain\x00"))
	if n := bytes.Count(sent, []byte("\x00ROLLBACK TO SAVEPOINT pgtraffic_explain\x00")); opened == 0 || n != opened {
		t.Errorf("pgtraffic opened %d savepoints and rolled back %d in their pipelines, want all", opened, n)
	}
	if n := bytes.Count(sent, []byte("ROLLBACK TO SAVEPOINT pgtraffic_explain; RELEASE")); n != 1 {
		t.Errorf("pgtraffic recovered from a failed EXPLAIN %d times, want 1", n)
	}

	type row struct {
		ID   int64
		Text string
	}
	read := func(query string) []row {
		t.Helper()
		rows, err := raw.QueryContext(ctx, query)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out []row
		for rows.Next() {
			var r row
			if err := rows.Scan(&r.ID, &r.Text); err != nil {
				t.Fatal(err)
			}
			out = append(out, r)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, tc := range []struct {
		query string
		want  []row
	}{
		{`select id, balance::text from accounts order by id`, []row{{1, "70"}, {2, "80"}}},
		{`select id, note from ledger order by id`, []row{{1, "a"}, {2, "b"}, {4, "c"}}}, // 3 was rolled back
		{`select id, body::text from docs order by id`, []row{{1, `{"k": 1}`}}},
	} {
		if got := read(tc.query); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s:\n got %v\nwant %v", tc.query, got, tc.want)
		}
	}
}

// TestAbortedTransactionSendsNoExplain: in a transaction the caller's own error has aborted,
// pgtraffic sends no EXPLAIN (nor savepoint) for the next statement, and the caller gets the
// server's 25P02 for that statement, exactly as with plain pgx.
func TestAbortedTransactionSendsNoExplain(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	raw := openRaw(t, dsn)
	createLedger(t, raw)
	_, db, wire := openRecorded(t, dsn, costTxRules)
	lg := tagging.With(ctx, "app", "ledger")
	const insert = `insert into accounts values ($1, $2)`

	run := func(db *sql.DB) (sent []byte, first, second error) {
		t.Helper()
		tx, err := db.BeginTx(lg, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		_, first = tx.ExecContext(lg, `select 1 / (id - id) from accounts`) // division by zero
		off := wire.offset()
		_, second = tx.ExecContext(lg, insert, 9, 9)
		return wire.since(off), first, second
	}
	_, wantFirst, wantSecond := run(raw)
	sent, first, second := run(db)

	var pgErr *pgconn.PgError
	if !errors.As(first, &pgErr) || pgErr.Code != "22012" {
		t.Fatalf("the caller's own error: %v", first)
	}
	if !errors.As(second, &pgErr) || pgErr.Code != "25P02" || errors.Is(second, driver.ErrBlocked) {
		t.Fatalf("the statement in the aborted transaction: want the server's 25P02, got %T %v", second, second)
	}
	if errText(first) != errText(wantFirst) || errText(second) != errText(wantSecond) {
		t.Fatalf("errors differ from plain pgx:\n got %q, %q\nwant %q, %q",
			errText(first), errText(second), errText(wantFirst), errText(wantSecond))
	}
	if bytes.Contains(sent, []byte("EXPLAIN")) || bytes.Contains(sent, []byte("SAVEPOINT")) {
		t.Fatal("pgtraffic sent an EXPLAIN or a savepoint in the aborted transaction")
	}
	if !bytes.Contains(sent, []byte(insert)) {
		t.Fatal("the caller's statement was not sent")
	}
	if n := queryInt(t, raw, ctx, `select count(*) from accounts`); n != 2 {
		t.Fatalf("%d accounts after the rolled-back transactions", n)
	}
}
