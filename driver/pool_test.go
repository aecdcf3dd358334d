package driver

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// DBTX is sqlc's pgx/v5 interface, as sqlc generates it in db.go: a *Pool and the pgx.Tx of its
// Begin must satisfy it for a generated package to run on them.
type DBTX interface {
	Exec(context.Context, string, ...interface{}) (pgconn.CommandTag, error)
	Query(context.Context, string, ...interface{}) (pgx.Rows, error)
	QueryRow(context.Context, string, ...interface{}) pgx.Row
	CopyFrom(ctx context.Context, tableName pgx.Identifier, columnNames []string, rowSrc pgx.CopyFromSource) (int64, error)
	SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
}

var (
	_ DBTX = (*Pool)(nil)
	_ DBTX = (*pgxTx)(nil)
	_ DBTX = (*PoolConn)(nil)
)

// fakeQuerier stands for a pgx connection: it records what is sent and answers with fake rows.
type fakeQuerier struct {
	sent      []string
	rows      int          // rows each query returns
	panicNext bool         // the rows' Next panics
	batches   int          // batches sent
	copies    int          // copies sent
	last      *fakePgxRows // the rows of the last query
}

func (f *fakeQuerier) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	f.sent = append(f.sent, sql)
	return pgconn.NewCommandTag("SELECT 1"), nil
}

func (f *fakeQuerier) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	f.sent = append(f.sent, sql)
	f.last = &fakePgxRows{left: f.rows, panicNext: f.panicNext}
	return f.last, nil
}

func (f *fakeQuerier) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	f.sent = append(f.sent, sql)
	row := &fakeRow{fakePgxRows{left: f.rows, panicNext: f.panicNext}}
	f.last = &row.fakePgxRows
	return row
}

func (f *fakeQuerier) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	f.batches++
	return &fakeResults{}
}

func (f *fakeQuerier) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	f.copies++
	return 1, nil
}

type fakePgxRows struct {
	left      int
	closed    bool
	panicNext bool
}

func (r *fakePgxRows) Close()                                       { r.closed = true }
func (r *fakePgxRows) Err() error                                   { return nil }
func (r *fakePgxRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (r *fakePgxRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (r *fakePgxRows) Next() bool {
	if r.panicNext {
		panic("fake rows: Next")
	}
	if r.closed || r.left == 0 {
		r.closed = true
		return false
	}
	r.left--
	return true
}
func (r *fakePgxRows) Scan(...any) error      { return nil }
func (r *fakePgxRows) Values() ([]any, error) { return nil, nil }
func (r *fakePgxRows) RawValues() [][]byte    { return nil }
func (r *fakePgxRows) Conn() *pgx.Conn        { return nil }
func (r *fakePgxRows) TypeMap() *pgtype.Map   { return nil }

// fakeRow is pgx's row over fake rows: Scan reads the first row and closes the rows, as pgx's
// does.
type fakeRow struct{ fakePgxRows }

func (r *fakeRow) Scan(...any) error {
	defer r.Close()
	if !r.Next() {
		return pgx.ErrNoRows
	}
	return nil
}

type fakeResults struct{ closed int }

func (r *fakeResults) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, nil }
func (r *fakeResults) Query() (pgx.Rows, error)         { return &fakePgxRows{}, nil }
func (r *fakeResults) QueryRow() pgx.Row                { return &batchRow{rows: &fakePgxRows{}} }
func (r *fakeResults) Close() error                     { r.closed++; return nil }
func (r *fakeResults) Tx() pgx.Tx                       { return nil }

// newTestRunner returns a runner over a core with rules (no server: statements are not
// explained), and a release counter for the connection its statements hold.
func newTestRunner(t *testing.T, rules string) (*runner, *releaseCount) {
	t.Helper()
	cc, err := pgx.ParseConfig("postgres://app@localhost/shop")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	o := buildOptions([]Option{WithConfig(cfg), WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))}, false)
	co, err := newCore(cc, nil, &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { co.close() })
	return newRunner(co), new(releaseCount)
}

// releaseCount counts the releases of a connection.
type releaseCount int

func (c *releaseCount) Release() { *c++ }

// fakePool stands for the pool a statement takes its connection from once admitted: each
// acquisition hands out q and is counted, each release is counted in released.
type fakePool struct {
	q        querier
	released *releaseCount
	acquired int
	// onAcquire, when set, runs at each acquisition, before the connection is handed out.
	onAcquire func()
}

func (p *fakePool) acquire(context.Context) (querier, releaser, error) {
	p.acquired++
	if p.onAcquire != nil {
		p.onAcquire()
	}
	return p.q, p.released, nil
}

// pooled is the destination of a statement of a pool whose connections are q.
func pooled(q querier, released *releaseCount) *dest {
	return &dest{pool: &fakePool{q: q, released: released}}
}

const oneSlot = `budgets: [{name: one, mode: enforce, max_concurrent: 1}]
rules: [{budget: one, match: {app: x}}]
guards: {require_where: enforce}
`

func inFlight(t *testing.T, r *runner) int {
	t.Helper()
	for _, b := range r.c.Snapshot().Budgets {
		if b.Name == "one" {
			return b.InFlight
		}
	}
	t.Fatal("no budget one")
	return 0
}

// TestPgxRowsEndOnce: rows read to the end finish their statement and release their connection
// once, however often they are closed after.
func TestPgxRowsEndOnce(t *testing.T) {
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	q := &fakeQuerier{rows: 2}
	rows, err := r.query(ctx, pooled(q, released), "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if inFlight(t, r) != 1 || *released != 0 {
		t.Fatalf("open rows: in flight %d, released %d", inFlight(t, r), *released)
	}
	for rows.Next() {
	}
	if inFlight(t, r) != 0 || *released != 1 {
		t.Fatalf("exhausted rows: in flight %d, released %d", inFlight(t, r), *released)
	}
	rows.Close()
	rows.Close()
	if rows.Next() || *released != 1 || r.c.engine.InFlight() != 0 {
		t.Fatalf("closed twice: released %d, engine in flight %d", *released, r.c.engine.InFlight())
	}
	// Closed early: the same.
	rows, err = r.query(ctx, pooled(q, released), "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	rows.Next()
	rows.Close()
	if inFlight(t, r) != 0 || *released != 2 {
		t.Fatalf("closed early: in flight %d, released %d", inFlight(t, r), *released)
	}
}

// TestPgxRowsPanicReleases: a panic in pgx's Next ends the statement: its slot and connection
// come back, and a Close after leaves pgx's rows alone (their connection is no longer theirs).
func TestPgxRowsPanicReleases(t *testing.T) {
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	q := &fakeQuerier{rows: 1, panicNext: true}
	rows, err := r.query(ctx, pooled(q, released), "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() { _ = recover() }()
		rows.Next()
	}()
	if inFlight(t, r) != 0 || *released != 1 {
		t.Fatalf("after a panic: in flight %d, released %d", inFlight(t, r), *released)
	}
	rows.Close()
	if q.last.closed || *released != 1 {
		t.Fatalf("Close after the end: pgx's rows closed %v, released %d", q.last.closed, *released)
	}
}

// reusedRowQuerier answers every QueryRow with the same one-row row, allocating nothing.
type reusedRowQuerier struct {
	fakeQuerier
	row fakeRow
}

func (q *reusedRowQuerier) QueryRow(context.Context, string, ...any) pgx.Row {
	q.row = fakeRow{fakePgxRows{left: 1}}
	return &q.row
}

// queryRowOutside runs a QueryRow as a caller outside the package sees it, whose row escapes:
// not inlined, so the compiler cannot keep the row on the test's stack.
//
//go:noinline
func queryRowOutside(ctx context.Context, r *runner, d *dest) pgx.Row {
	return r.queryRow(ctx, d, "select 1", nil)
}

// pgxRowOutside is pgx's QueryRow as such a caller sees it: a row of unknown type.
//
//go:noinline
func pgxRowOutside(ctx context.Context, q querier) pgx.Row { return q.QueryRow(ctx, "select 1") }

// TestPgxRowAllocation: a QueryRow and its Scan, admitted by a budget, allocate nothing beyond
// pgx's on average: the row comes from its ticket's slab, one allocation per rowSlab rows.
func TestPgxRowAllocation(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector drops sync.Pool entries at random")
	}
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	var q querier = new(reusedRowQuerier)
	var n int
	// The caller's own: Scan's arguments, which escape through pgx's row.
	scanAllocs := testing.AllocsPerRun(100, func() {
		if err := pgxRowOutside(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
	})
	const runs = 10 * rowSlab
	d := pooled(q, released)
	allocs := testing.AllocsPerRun(runs, func() {
		if err := queryRowOutside(ctx, r, d).Scan(&n); err != nil {
			t.Fatal(err)
		}
	})
	// AllocsPerRun rounds down: the slabs' allocations, one per rowSlab rows, are below one.
	if allocs != scanAllocs {
		t.Fatalf("%v allocations per QueryRow, want %v (Scan's arguments)", allocs, scanAllocs)
	}
	if inFlight(t, r) != 0 || int(*released) < runs {
		t.Fatalf("in flight %d, released %d", inFlight(t, r), *released)
	}
}

// TestPgxRefusedSendsNothing: a refused Exec, Query, QueryRow, CopyFrom or batch of the pool
// sends nothing, returns the *BlockedError and never takes a connection: the pool decides before
// it acquires.
func TestPgxRefusedSendsNothing(t *testing.T) {
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	q := &fakeQuerier{}
	pool := &fakePool{q: q, released: released}
	d := &dest{pool: pool}
	hold, err := r.query(ctx, d, "select 1", nil)
	if err != nil {
		t.Fatal(err)
	}
	if pool.acquired != 1 {
		t.Fatalf("an admitted query took %d connections", pool.acquired)
	}
	q.sent = nil
	if _, err := r.exec(ctx, d, "select 2", nil); !errors.Is(err, ErrBlocked) {
		t.Fatalf("exec: %v", err)
	}
	rows, err := r.query(ctx, d, "select 2", nil)
	var be *BlockedError
	if !errors.As(err, &be) || !errors.As(rows.Err(), &be) {
		t.Fatalf("query: %v, rows %v", err, rows.Err())
	}
	if err := r.queryRow(ctx, d, "select 2", nil).Scan(); !errors.As(err, &be) {
		t.Fatalf("row: %v", err)
	}
	if _, err := r.copyFrom(ctx, d, pgx.Identifier{"t"}, nil, nil); !errors.As(err, &be) {
		t.Fatalf("copy: %v", err)
	}
	b := &pgx.Batch{}
	b.Queue("select 3")
	if err := r.sendBatch(ctx, d, b).Close(); !errors.As(err, &be) {
		t.Fatalf("batch: %v", err)
	}
	if _, err := r.exec(context.Background(), d, "delete from t", nil); !errors.Is(err, ErrBlocked) {
		t.Fatalf("guard: %v", err)
	}
	if len(q.sent) != 0 || q.copies != 0 || q.batches != 0 {
		t.Fatalf("sent %q, copies %d, batches %d", q.sent, q.copies, q.batches)
	}
	if pool.acquired != 1 || *released != 0 {
		t.Fatalf("refused statements took connections: acquired %d, released %d", pool.acquired, *released)
	}
	hold.Close()
	if *released != 1 {
		t.Fatalf("released %d after the admitted query closed, want 1", *released)
	}
}

// TestPgxBatchRefusedFansOut: a refused batch sends nothing, every result returns the
// *BlockedError, and its connection is released once; an admitted one holds its slot until
// its results are closed.
func TestPgxBatchRefusedFansOut(t *testing.T) {
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	q := &fakeQuerier{}
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("delete from t")
	br := r.sendBatch(ctx, pooled(q, released), b)
	_, err1 := br.Exec()
	_, err2 := br.Query()
	err3 := br.QueryRow().Scan()
	err4 := br.Close()
	for i, err := range []error{err1, err2, err3, err4} {
		var be *BlockedError
		if !errors.As(err, &be) || be.Reason != ReasonGuard {
			t.Fatalf("result %d: %v", i, err)
		}
	}
	if q.batches != 0 || *released != 0 {
		t.Fatalf("batches sent %d, released %d", q.batches, *released)
	}

	b = &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select 2")
	br = r.sendBatch(ctx, pooled(q, released), b)
	if q.batches != 1 || inFlight(t, r) != 1 {
		t.Fatalf("admitted: sent %d, in flight %d", q.batches, inFlight(t, r))
	}
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	br.Close()
	if inFlight(t, r) != 0 || *released != 1 || r.c.engine.InFlight() != 0 {
		t.Fatalf("closed: in flight %d, released %d", inFlight(t, r), *released)
	}
}

// TestNewPoolBadInput: a bad DSN or a config pgxpool.ParseConfig did not make is a clear error,
// not a panic.
func TestNewPoolBadInput(t *testing.T) {
	ctx := context.Background()
	if _, err := NewPool(ctx, "postgres://a@b/c?pool_max_conns=zero"); err == nil || !strings.HasPrefix(err.Error(), "pgtraffic: ") {
		t.Fatalf("bad dsn: %v", err)
	}
	if _, err := NewPoolFromConfig(ctx, nil); err == nil || !strings.Contains(err.Error(), "nil") {
		t.Fatalf("nil config: %v", err)
	}
	if _, err := NewPoolFromConfig(ctx, &pgxpool.Config{}); err == nil || !strings.Contains(err.Error(), "pgxpool.ParseConfig") {
		t.Fatalf("hand-made config: %v", err)
	}
	if _, err := NewPool(ctx, "postgres://a@b/c", WithRulesFile("/nonexistent/rules.yaml")); err == nil {
		t.Fatal("a missing rules file must be an error")
	}
}

// TestBatchRowDriverBytes: a batch's QueryRow refuses *pgtype.DriverBytes, as pgx's does (the
// bytes would outlive the rows), and closes its rows. (The statement's row is pgx's own, whose
// Scan refuses them: integration's TestPoolQueryRow.)
func TestBatchRowDriverBytes(t *testing.T) {
	rows := &fakePgxRows{left: 1}
	row := &batchRow{rows: rows}
	if err := row.Scan(&pgtype.DriverBytes{}); err == nil || !strings.Contains(err.Error(), "DriverBytes") {
		t.Fatalf("scan: %v", err)
	}
	if !rows.closed {
		t.Fatal("the rows are left open")
	}
}

// TestPgxRowEnds: a QueryRow's Scan ends its statement once, whatever pgx's Scan does: a row, no
// row (pgx.ErrNoRows, returned as it is), or a panic, which gives back the slot and the
// connection too.
func TestPgxRowEnds(t *testing.T) {
	r, released := newTestRunner(t, oneSlot)
	ctx := tagging.With(context.Background(), "app", "x")
	for i, tc := range []struct {
		name      string
		rows      int
		panicNext bool
		want      error
	}{
		{name: "row", rows: 1},
		{name: "no row", rows: 0, want: pgx.ErrNoRows},
		{name: "panic", rows: 1, panicNext: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := &fakeQuerier{rows: tc.rows, panicNext: tc.panicNext}
			row := r.queryRow(ctx, pooled(q, released), "select 1", nil)
			if len(q.sent) != 1 || inFlight(t, r) != 1 || int(*released) != i {
				t.Fatalf("before Scan: sent %q, in flight %d, released %d", q.sent, inFlight(t, r), *released)
			}
			var err error
			func() {
				defer func() {
					if p := recover(); (p != nil) != tc.panicNext {
						t.Fatalf("panic %v", p)
					}
				}()
				err = row.Scan()
			}()
			if err != tc.want {
				t.Fatalf("Scan: %v, want %v", err, tc.want)
			}
			if inFlight(t, r) != 0 || int(*released) != i+1 || r.c.engine.InFlight() != 0 {
				t.Fatalf("after Scan: in flight %d, released %d", inFlight(t, r), *released)
			}
			if tc.panicNext {
				return
			}
			// A second Scan is pgx's answer alone: the statement ended with the first, and its
			// row, which stays in its ticket's slab a while, keeps none of its caller's.
			row.Scan()
			if pr := row.(*pgxRow); pr.open.qctx != nil || pr.open.ctx != nil || pr.open.j != nil || pr.open.release != nil {
				t.Fatalf("an ended row keeps its statement's: %+v", pr.open)
			}
			if inFlight(t, r) != 0 || int(*released) != i+1 || r.c.engine.InFlight() != 0 {
				t.Fatalf("after a second Scan: in flight %d, released %d", inFlight(t, r), *released)
			}
		})
	}
}

// TestPoolHasPgxpoolMethods: every exported method of *pgxpool.Pool is a method of *Pool with
// the same signature, a *pgxpool.Conn being a *PoolConn, so code written for pgxpool compiles
// against a Pool.
func TestPoolHasPgxpoolMethods(t *testing.T) {
	ours := reflect.TypeFor[*Pool]()
	theirs := reflect.TypeFor[*pgxpool.Pool]()
	sig := func(m reflect.Method) string { // the signature without the receiver
		var in, out []string
		for i := 1; i < m.Type.NumIn(); i++ {
			in = append(in, m.Type.In(i).String())
		}
		for i := range m.Type.NumOut() {
			out = append(out, m.Type.Out(i).String())
		}
		s := "(" + strings.Join(in, ", ") + ") (" + strings.Join(out, ", ") + ")"
		return strings.ReplaceAll(s, "*pgxpool.Conn", "*driver.PoolConn")
	}
	for i := range theirs.NumMethod() {
		m := theirs.Method(i)
		o, ok := ours.MethodByName(m.Name)
		if !ok {
			t.Errorf("*Pool has no %s", m.Name)
			continue
		}
		if sig(o) != sig(m) {
			t.Errorf("%s: %s, pgxpool's %s", m.Name, sig(o), sig(m))
		}
	}
}

// TestPgxExplainedRefusedGivesConnectionBack: a statement whose cost needs an EXPLAIN takes its
// connection once its budget has room for it, and is decided there. When that room went while
// it took the connection (here a statement on a held connection takes the budget's one slot
// meanwhile), it is refused there and gives the connection back, once, unsent; admitted, it
// keeps it until it ends.
func TestPgxExplainedRefusedGivesConnectionBack(t *testing.T) {
	r, released := newTestRunner(t, `budgets: [{name: one, mode: enforce, max_concurrent: 1, server_share: 1}]
rules: [{budget: one, match: {app: x}}]
`)
	ctx := tagging.With(context.Background(), "app", "x")
	q := &fakeQuerier{}
	pool := &fakePool{q: q, released: released}
	d := &dest{pool: pool}
	var hold pgx.Rows
	pool.onAcquire = func() {
		pool.onAcquire = nil
		var err error
		if hold, err = r.query(ctx, &dest{q: q}, "select * from a where id = $1", []any{1}); err != nil {
			t.Errorf("the statement on a held connection: %v", err)
		}
	}
	if _, err := r.exec(ctx, d, "select * from b where id = $1", []any{1}); !errors.Is(err, ErrBlocked) { // never costed
		t.Fatalf("exec whose slot was taken while it took its connection: %v", err)
	}
	if pool.acquired != 1 || *released != 1 || len(q.sent) != 1 {
		t.Fatalf("refused on its connection: acquired %d, released %d, sent %q", pool.acquired, *released, q.sent)
	}
	hold.Close()
	rows, err := r.query(ctx, d, "select * from b where id = $1", []any{1})
	if err != nil {
		t.Fatal(err)
	}
	if pool.acquired != 2 || *released != 1 {
		t.Fatalf("admitted: acquired %d, released %d", pool.acquired, *released)
	}
	rows.Close()
	if *released != 2 || inFlight(t, r) != 0 {
		t.Fatalf("closed: released %d, in flight %d", *released, inFlight(t, r))
	}
}
