package integration

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// openPool opens a pgtraffic Pool with the given rules on a fresh database; it returns the dsn
// too, for a connection of the test's own.
func openPool(t *testing.T, rules string, opts ...driver.Option) (*driver.Pool, string) {
	t.Helper()
	dsn := pgtest.Shared(t).CreateDatabase(t)
	return openPoolAt(t, dsn, rules, opts...), dsn
}

// openPoolAt opens a *driver.Pool at dsn under rules, closed when the test ends.
func openPoolAt(t *testing.T, dsn, rules string, opts ...driver.Option) *driver.Pool {
	t.Helper()
	cfg, err := driver.ParseConfig([]byte(rules))
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPool(context.Background(), dsn, append([]driver.Option{driver.WithConfig(cfg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func poolBudget(t *testing.T, p *driver.Pool, name string) driver.BudgetStatus {
	t.Helper()
	for _, b := range p.Snapshot().Budgets {
		if b.Name == name {
			return b
		}
	}
	t.Fatalf("no budget %q", name)
	return driver.BudgetStatus{}
}

// TestPoolRuns: Exec, Query, QueryRow and a transaction from Begin work through the pool.
func TestPoolRuns(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: all, mode: enforce, max_concurrent: 2}]
rules: [{budget: all, match: {app: t}}]
`)
	ctx := tagging.With(context.Background(), "app", "t")
	if _, err := p.Exec(ctx, "create table items (id int primary key, name text)"); err != nil {
		t.Fatal(err)
	}
	if tag, err := p.Exec(ctx, "insert into items values ($1, $2), ($3, $4)", 1, "a", 2, "b"); err != nil || tag.RowsAffected() != 2 {
		t.Fatalf("insert: %v %v", tag, err)
	}
	rows, err := p.Query(ctx, "select id from items order by id")
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil || len(ids) != 2 || ids[0] != 1 || ids[1] != 2 {
		t.Fatalf("ids %v %v", ids, err)
	}
	var name string
	if err := p.QueryRow(ctx, "select name from items where id = $1", 2).Scan(&name); err != nil || name != "b" {
		t.Fatalf("name %q %v", name, err)
	}
	if err := p.QueryRow(ctx, "select name from items where id = $1", 3).Scan(&name); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no row: %v", err)
	}
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "insert into items values (3, 'c')"); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil || n != 2 {
		t.Fatalf("count %d %v", n, err)
	}
	if b := poolBudget(t, p, "all"); b.InFlight != 0 || b.Admitted < 6 {
		t.Fatalf("budget after: %+v", b)
	}
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("connections still acquired: %d", s.AcquiredConns())
	}
}

// TestPoolQueryRow: a QueryRow's Scan gives back the statement's slot and the pool's connection
// whatever it returns: a row, pgx.ErrNoRows, the query's error, or pgx's refusal of
// *pgtype.DriverBytes; on an acquired connection and in a transaction alike.
func TestPoolQueryRow(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: all, mode: enforce, max_concurrent: 1}]
rules: [{budget: all, match: {app: t}}]
`)
	ctx := tagging.With(context.Background(), "app", "t")
	check := func(name string) {
		t.Helper()
		if b := poolBudget(t, p, "all"); b.InFlight != 0 {
			t.Fatalf("%s: %d in flight", name, b.InFlight)
		}
		if s := p.Stat(); s.AcquiredConns() != 0 {
			t.Fatalf("%s: %d connections acquired", name, s.AcquiredConns())
		}
	}
	var n int
	if err := p.QueryRow(ctx, "select 1").Scan(&n); err != nil || n != 1 {
		t.Fatalf("row: %d %v", n, err)
	}
	check("row")
	if err := p.QueryRow(ctx, "select 1 where false").Scan(&n); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("no row: %v", err)
	}
	check("no row")
	if err := p.QueryRow(ctx, "select 1/0").Scan(&n); err == nil {
		t.Fatal("division by zero: no error")
	}
	check("error")
	if err := p.QueryRow(ctx, "select 'x'::bytea").Scan(&pgtype.DriverBytes{}); err == nil || !strings.Contains(err.Error(), "DriverBytes") {
		t.Fatalf("DriverBytes: %v", err)
	}
	check("DriverBytes")

	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.QueryRow(ctx, "select 2").Scan(&n); err != nil || n != 2 {
		t.Fatalf("acquired: %d %v", n, err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "select 3").Scan(&n); err != nil || n != 3 {
		t.Fatalf("tx: %d %v", n, err)
	}
	if err := tx.QueryRow(ctx, "select 4").Scan(&n); err != nil || n != 4 {
		t.Fatalf("tx, second: %d %v", n, err) // the first row's Scan left the connection usable
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	c.Release()
	check("acquired")
}

// TestPoolMaxConcurrentOnServer: under a max_concurrent: 2 budget, N goroutines running
// pg_sleep never have more than 2 of them active on the server, as sampled from
// pg_stat_activity on a connection of the test's own.
func TestPoolMaxConcurrentOnServer(t *testing.T) {
	const limit, workers = 2, 8
	p, dsn := openPool(t, `budgets: [{name: slow, mode: enforce, max_concurrent: 2, max_wait: 30s, max_queue: 8}]
rules: [{budget: slow, match: {app: batch}}]
`)
	watch, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(context.Background())
	ctx := tagging.With(context.Background(), "app", "batch")
	var wg sync.WaitGroup
	var ran, failed atomic.Int32
	done := make(chan struct{})
	for range workers {
		wg.Go(func() {
			if _, err := p.Exec(ctx, "select pg_sleep(0.2)"); err != nil {
				t.Error(err)
				failed.Add(1)
				return
			}
			ran.Add(1)
		})
	}
	go func() { wg.Wait(); close(done) }()
	maxSeen, samples := 0, 0
	for sampling := true; sampling; {
		select {
		case <-done:
			sampling = false
		default:
		}
		var n int
		if err := watch.QueryRow(context.Background(),
			"select count(*) from pg_stat_activity where state = 'active' and query = 'select pg_sleep(0.2)'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		maxSeen = max(maxSeen, n)
		samples++
	}
	if ran.Load() != workers || failed.Load() != 0 {
		t.Fatalf("ran %d of %d", ran.Load(), workers)
	}
	if maxSeen > limit || maxSeen == 0 {
		t.Fatalf("at most %d statements on the server at once, want 1..%d (%d samples)", maxSeen, limit, samples)
	}
	t.Logf("max %d active of %d workers over %d samples", maxSeen, workers, samples)
}

// TestPoolTxBlockedStatementLeavesTxUsable: a statement refused inside a transaction from
// Pool.Begin returns a *BlockedError, nothing is sent, and the transaction goes on.
func TestPoolTxBlockedStatementLeavesTxUsable(t *testing.T) {
	p, _ := openPool(t, `guards: {require_where: enforce}`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "insert into items values (1), (2)"); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "delete from items")
	if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
		t.Fatalf("reason %q", be.Reason)
	}
	rows, err := tx.Query(ctx, "update items set id = 0")
	asBlocked(t, err)
	asBlocked(t, rows.Err())
	var n int
	err = tx.QueryRow(ctx, "delete from items returning 1").Scan(&n)
	asBlocked(t, err)
	// A statement prepared in the transaction is decided as its text when run by its name.
	if _, err := tx.Prepare(ctx, "wipe", "delete from items"); err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "wipe")
	asBlocked(t, err)
	if _, err := tx.Prepare(ctx, "one", "select count(*) from items where id = $1"); err != nil {
		t.Fatal(err)
	}
	if err := tx.QueryRow(ctx, "one", 1).Scan(&n); err != nil || n != 1 {
		t.Fatalf("prepared query %d %v", n, err)
	}
	// Nothing was sent: the transaction is not aborted and its rows are all there.
	if err := tx.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil || n != 2 {
		t.Fatalf("count in tx %d %v", n, err)
	}
	nested, err := tx.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = nested.Exec(ctx, "delete from items")
	asBlocked(t, err)
	if err := nested.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil || n != 2 {
		t.Fatalf("count after commit %d %v", n, err)
	}
}

// TestPoolPerQueryLimitRefusesEnormousQuery: a cross join of four million-row series is refused
// by its predicted cost, before it runs.
func TestPoolPerQueryLimitRefusesEnormousQuery(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: report, mode: enforce, per_query_limit: 1s}]
rules: [{budget: report, match: {app: report}}]
`)
	ctx := tagging.With(context.Background(), "app", "report")
	start := time.Now()
	var n int64
	err := p.QueryRow(ctx, `select count(*) from generate_series(1, 1000000) a, generate_series(1, 1000000) b,
		generate_series(1, 1000000) c, generate_series(1, 1000000) d`).Scan(&n)
	if be := asBlocked(t, err); be.Reason != driver.ReasonPerQuery {
		t.Fatalf("reason %q", be.Reason)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("refused after %v: it ran", took)
	}
	if b := poolBudget(t, p, "report"); b.Blocked != 1 || b.InFlight != 0 {
		t.Fatalf("budget %+v", b)
	}
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("connections still acquired: %d", s.AcquiredConns())
	}
}

// TestPoolBatchWithUnqualifiedDeleteChangesNothing: a batch holding a DELETE with no WHERE is
// refused by require_where before anything is sent: its INSERT does not run either, and every
// result returns the *BlockedError.
func TestPoolBatchWithUnqualifiedDeleteChangesNothing(t *testing.T) {
	p, _ := openPool(t, `guards: {require_where: enforce}`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int); insert into items values (1), (2)"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.Queue("insert into items values ($1)", 3)
	b.Queue("delete from items")
	b.Queue("select count(*) from items")
	br := p.SendBatch(ctx, b)
	_, err := br.Exec()
	if be := asBlocked(t, err); be.Reason != driver.ReasonGuard {
		t.Fatalf("reason %q", be.Reason)
	}
	_, err = br.Query()
	asBlocked(t, err)
	var n int
	asBlocked(t, br.QueryRow().Scan(&n))
	asBlocked(t, br.Close())
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil || n != 2 {
		t.Fatalf("count %d %v: the batch changed something", n, err)
	}
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("connections still acquired: %d", s.AcquiredConns())
	}

	// A batch the guard accepts runs whole, its results in order, in a transaction too.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b = &pgx.Batch{}
	b.Queue("insert into items values ($1)", 3)
	b.Queue("select count(*) from items")
	br = tx.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := br.QueryRow().Scan(&n); err != nil || n != 3 {
		t.Fatalf("count in batch %d %v", n, err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	b = &pgx.Batch{}
	b.Queue("delete from items")
	if err := tx.SendBatch(ctx, b).Close(); !errors.Is(err, driver.ErrBlocked) {
		t.Fatalf("delete in a tx's batch: %v", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatalf("commit after a refused batch: %v", err)
	}
}

// TestPoolBatchHoldsSlotUntilClosed: an admitted batch holds its budget's slot until its
// results are closed.
func TestPoolBatchHoldsSlotUntilClosed(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: one, mode: enforce, max_concurrent: 1}]
rules: [{budget: one, match: {app: x}}]
`)
	ctx := tagging.With(context.Background(), "app", "x")
	b := &pgx.Batch{}
	b.Queue("select 1")
	b.Queue("select 2")
	br := p.SendBatch(ctx, b)
	if got := poolBudget(t, p, "one").InFlight; got != 1 {
		t.Fatalf("in flight %d, want 1", got)
	}
	_, err := p.Exec(ctx, "select 3")
	if be := asBlocked(t, err); be.Reason != driver.ReasonConcurrency {
		t.Fatalf("reason %q", be.Reason)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	if got := poolBudget(t, p, "one").InFlight; got != 0 {
		t.Fatalf("in flight %d after Close", got)
	}
	if _, err := p.Exec(ctx, "select 3"); err != nil {
		t.Fatal(err)
	}
}

// TestPoolCopyFrom: a COPY is a statement tagged statement=copy and table=<name>: refused while
// its budget's only slot is held, counted in the budget when it runs.
func TestPoolCopyFrom(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: loads, mode: enforce, max_concurrent: 1}]
rules:
  - {budget: loads, match: {statement: copy, table: items}}
  - {budget: loads, match: {app: load}}
`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int, name text)"); err != nil {
		t.Fatal(err)
	}
	src := [][]any{{1, "a"}, {2, "b"}, {3, "c"}}
	// The budget's only slot is held by an open query.
	rows, err := p.Query(tagging.With(ctx, "app", "load"), "select 1")
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, pgx.CopyFromRows(src))
	if be := asBlocked(t, err); be.Budget != "loads" || be.Reason != driver.ReasonConcurrency {
		t.Fatalf("refusal %+v", be)
	}
	rows.Close()
	admitted := poolBudget(t, p, "loads").Admitted
	n, err := p.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, pgx.CopyFromRows(src))
	if err != nil || n != 3 {
		t.Fatalf("copy %d %v", n, err)
	}
	if b := poolBudget(t, p, "loads"); b.Admitted != admitted+1 || b.InFlight != 0 || b.Blocked != 1 {
		t.Fatalf("budget after the copy: %+v (admitted before %d)", b, admitted)
	}
	var count int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&count); err != nil || count != 3 {
		t.Fatalf("rows copied %d %v", count, err)
	}
	// In a transaction too.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if n, err := tx.CopyFrom(ctx, pgx.Identifier{"items"}, []string{"id", "name"}, pgx.CopyFromRows(src)); err != nil || n != 3 {
		t.Fatalf("copy in tx %d %v", n, err)
	}
	if b := poolBudget(t, p, "loads"); b.Admitted != admitted+2 {
		t.Fatalf("the tx's copy was not decided: %+v", b)
	}
}

// TestPoolBatchBeginTx: a batch that begins a transaction (pgx.Batch.BeginTx) keeps its
// connection until the transaction ends, and the transaction's statements are controlled.
func TestPoolBatchBeginTx(t *testing.T) {
	p, _ := openPool(t, `guards: {require_where: enforce}`)
	ctx := context.Background()
	if _, err := p.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	b := &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("insert into items values (1)")
	br := p.SendBatch(ctx, b)
	if _, err := br.Exec(); err != nil {
		t.Fatal(err)
	}
	if err := br.Close(); err != nil {
		t.Fatal(err)
	}
	tx := br.Tx()
	if tx == nil {
		t.Fatal("no transaction")
	}
	if s := p.Stat(); s.AcquiredConns() != 1 {
		t.Fatalf("acquired %d while the batch's transaction is open, want 1", s.AcquiredConns())
	}
	_, err := tx.Exec(ctx, "delete from items")
	asBlocked(t, err)
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("acquired %d after commit", s.AcquiredConns())
	}
	var n int
	if err := p.QueryRow(ctx, "select count(*) from items").Scan(&n); err != nil || n != 1 {
		t.Fatalf("count %d %v", n, err)
	}
	// A refused batch that would begin a transaction sends nothing and releases the connection.
	b = &pgx.Batch{}
	b.BeginTx(pgx.TxOptions{})
	b.Queue("delete from items")
	br = p.SendBatch(ctx, b)
	asBlocked(t, br.Close())
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("acquired %d after a refused batch", s.AcquiredConns())
	}
}

// TestPoolAcquire: the statements of a connection from Pool.Acquire are controlled; Release
// gives it back.
func TestPoolAcquire(t *testing.T) {
	p, _ := openPool(t, `budgets: [{name: one, mode: enforce, max_concurrent: 1}]
rules: [{budget: one, match: {app: x}}]
guards: {require_where: enforce}
`)
	ctx := tagging.With(context.Background(), "app", "x")
	c, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := c.Query(ctx, "select 1")
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if _, err := c.Exec(ctx, "create table items (id int)"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(ctx, "delete from items")
	asBlocked(t, err)
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tx.Exec(ctx, "delete from items")
	asBlocked(t, err)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if got := poolBudget(t, p, "one"); got.InFlight != 0 || got.Admitted != 2 {
		t.Fatalf("budget %+v", got)
	}
	c.Release()
	if s := p.Stat(); s.AcquiredConns() != 0 {
		t.Fatalf("acquired %d after Release", s.AcquiredConns())
	}
}

// blockAll is a rules file whose enforce budget admits nothing tagged app=x: a statement
// refused with a *BlockedError shows it went through traffic control.
const blockAll = `budgets: [{name: none, mode: enforce, max_concurrent: 0}]
rules: [{budget: none, match: {app: x}}]
`

// warmPool opens n connections in p at once and releases them, leaving n idle; it returns
// their backend pids.
func warmPool(t *testing.T, p *driver.Pool, n int) map[uint32]bool {
	t.Helper()
	ctx := context.Background()
	pids := map[uint32]bool{}
	var conns []*driver.PoolConn
	for range n {
		c, err := p.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		pids[backendPID(t, c)] = true
	}
	for _, c := range conns {
		c.Release()
	}
	if got := p.Stat().IdleConns(); got != int32(n) {
		t.Fatalf("%d idle after warming, want %d", got, n)
	}
	return pids
}

// releaseLater returns a func releasing c once, also called when the test ends (before the
// pool's Close, which would wait for c) if a failure stopped the test first.
func releaseLater(t *testing.T, c *driver.PoolConn) func() {
	var once sync.Once
	release := func() { once.Do(c.Release) }
	t.Cleanup(release)
	return release
}

// backendPID is the server process of c, asked with an untagged (so undecided) statement.
func backendPID(t *testing.T, c *driver.PoolConn) uint32 {
	t.Helper()
	var pid uint32
	if err := c.QueryRow(context.Background(), "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestPoolAcquireFunc: the statements f runs on the connection AcquireFunc gives it are
// controlled, f's error is returned, and the connection is released after f returns, returns
// an error or panics; an acquire that fails does not call f.
func TestPoolAcquireFunc(t *testing.T) {
	p, _ := openPool(t, blockAll)
	ctx := tagging.With(context.Background(), "app", "x")
	var last *driver.PoolConn // the connection f was given, released here if AcquireFunc leaked it
	acquired := func(name string, want int32) {
		t.Helper()
		if got := p.Stat().AcquiredConns(); got != want {
			if want == 0 && last != nil {
				last.Release() // so that the pool's Close does not wait for it
			}
			t.Fatalf("%s: %d connections acquired, want %d", name, got, want)
		}
	}
	calls := 0
	if err := p.AcquireFunc(ctx, func(c *driver.PoolConn) error {
		calls++
		last = c
		acquired("in f", 1)
		_, err := c.Exec(ctx, "select 1")
		asBlocked(t, err)
		var n int
		asBlocked(t, c.QueryRow(ctx, "select 1").Scan(&n))
		if err := c.QueryRow(context.Background(), "select 2").Scan(&n); err != nil || n != 2 {
			t.Fatalf("untagged statement: %d %v", n, err) // the connection itself works
		}
		return nil
	}); err != nil || calls != 1 {
		t.Fatalf("AcquireFunc: %v, f called %d times", err, calls)
	}
	acquired("after f", 0)

	errF := errors.New("f failed")
	if err := p.AcquireFunc(ctx, func(c *driver.PoolConn) error {
		last = c
		_, err := c.Exec(ctx, "select 1")
		asBlocked(t, err)
		return errF
	}); !errors.Is(err, errF) {
		t.Fatalf("AcquireFunc returned %v, want f's error", err)
	}
	acquired("after f's error", 0)

	recovered := func() (r any) {
		defer func() { r = recover() }()
		_ = p.AcquireFunc(ctx, func(c *driver.PoolConn) error {
			last = c
			acquired("before the panic", 1)
			panic("boom")
		})
		return nil
	}()
	if recovered != "boom" {
		t.Fatalf("recovered %v, want f's panic", recovered)
	}
	acquired("after f's panic", 0)

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	calls = 0
	if err := p.AcquireFunc(cancelled, func(*driver.PoolConn) error { calls++; return nil }); !errors.Is(err, context.Canceled) || calls != 0 {
		t.Fatalf("cancelled acquire: %v, f called %d times", err, calls)
	}
	if b := poolBudget(t, p, "none"); b.InFlight != 0 || b.Admitted != 0 || b.Blocked != 3 {
		t.Fatalf("budget %+v", b)
	}
}

// TestPoolAcquireAllIdle: AcquireAllIdle takes every idle connection, as many as pgxpool counts
// idle, and their statements are controlled.
func TestPoolAcquireAllIdle(t *testing.T) {
	p, _ := openPool(t, blockAll)
	ctx := tagging.With(context.Background(), "app", "x")
	if conns := p.AcquireAllIdle(ctx); len(conns) != 0 {
		t.Fatalf("%d connections from an empty pool", len(conns))
	}
	warmed := warmPool(t, p, 3)
	idle := p.Stat().IdleConns()
	conns := p.AcquireAllIdle(ctx)
	var release []func()
	for _, c := range conns {
		release = append(release, releaseLater(t, c))
	}
	if len(conns) != int(idle) || len(conns) != 3 {
		t.Fatalf("%d connections, pgxpool counted %d idle", len(conns), idle)
	}
	if s := p.Stat(); s.AcquiredConns() != 3 || s.IdleConns() != 0 {
		t.Fatalf("acquired %d, idle %d after AcquireAllIdle", s.AcquiredConns(), s.IdleConns())
	}
	seen := map[uint32]bool{}
	for _, c := range conns {
		_, err := c.Exec(ctx, "select 1")
		asBlocked(t, err)
		rows, err := c.Query(ctx, "select 1")
		asBlocked(t, err)
		rows.Close()
		pid := backendPID(t, c)
		if !warmed[pid] || seen[pid] {
			t.Fatalf("pid %d: not one of the idle connections %v, or twice", pid, warmed)
		}
		seen[pid] = true
	}
	for _, r := range release {
		r()
	}
	if s := p.Stat(); s.AcquiredConns() != 0 || s.IdleConns() != 3 {
		t.Fatalf("acquired %d, idle %d after Release", s.AcquiredConns(), s.IdleConns())
	}
	if b := poolBudget(t, p, "none"); b.InFlight != 0 || b.Blocked != 6 {
		t.Fatalf("budget %+v", b)
	}
}

// TestPoolConfig: Config is the pool's pgxpool configuration, and a copy: changing it changes
// neither the pool nor the next copy.
func TestPoolConfig(t *testing.T) {
	p, _ := openPool(t, blockAll)
	cfg := p.Config()
	if cfg == nil || cfg.ConnConfig == nil {
		t.Fatal("no config")
	}
	want := cfg.MaxConns
	if want != p.Stat().MaxConns() {
		t.Fatalf("Config().MaxConns %d, the pool's %d", want, p.Stat().MaxConns())
	}
	if want != p.Raw().Config().MaxConns || cfg.ConnConfig.Database != p.Raw().Config().ConnConfig.Database {
		t.Fatalf("Config() is not the pool's: %+v", cfg)
	}
	database := cfg.ConnConfig.Database
	cfg.MaxConns = want + 7
	cfg.ConnConfig.Database = "elsewhere"
	again := p.Config()
	if again == cfg || again.MaxConns != want || again.ConnConfig.Database != database {
		t.Fatalf("a change to Config's result reached the pool: MaxConns %d, database %q", again.MaxConns, again.ConnConfig.Database)
	}
	if p.Stat().MaxConns() != want {
		t.Fatalf("the pool's MaxConns is %d after a change to a copy", p.Stat().MaxConns())
	}
}

// TestPoolReset: Reset closes the idle connections at once (on the server too) and one in use
// when it is released; the next acquire opens a new connection, and the pool is still
// controlled.
func TestPoolReset(t *testing.T) {
	p, dsn := openPool(t, blockAll)
	ctx := context.Background()
	warmed := warmPool(t, p, 2)
	inUse, err := p.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	releaseInUse := releaseLater(t, inUse)
	inUsePID := backendPID(t, inUse)
	if s := p.Stat(); s.TotalConns() != 2 || s.AcquiredConns() != 1 {
		t.Fatalf("total %d, acquired %d before Reset", s.TotalConns(), s.AcquiredConns())
	}
	p.Reset()
	if s := p.Stat(); s.TotalConns() != 1 || s.IdleConns() != 0 {
		t.Fatalf("total %d, idle %d after Reset, want the one in use only", s.TotalConns(), s.IdleConns())
	}
	if got := backendPID(t, inUse); got != inUsePID {
		t.Fatalf("the connection in use changed: pid %d, was %d", got, inUsePID)
	}
	releaseInUse()
	if s := p.Stat(); s.TotalConns() != 0 {
		t.Fatalf("total %d after the connection in use was released", s.TotalConns())
	}
	// The old backends, the released one's too, go away on the server.
	watch, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close(ctx)
	old := []uint32{inUsePID}
	for pid := range warmed {
		old = append(old, pid)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := watch.QueryRow(ctx, "select count(*) from pg_stat_activity where pid = any($1)", old).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the reset connections %v still on the server", n, old)
		}
		time.Sleep(20 * time.Millisecond)
	}
	err = p.AcquireFunc(ctx, func(c *driver.PoolConn) error {
		if pid := backendPID(t, c); warmed[pid] || pid == inUsePID {
			t.Fatalf("pid %d after Reset is an old connection's", pid)
		}
		_, err := c.Exec(tagging.With(ctx, "app", "x"), "select 1")
		asBlocked(t, err)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
