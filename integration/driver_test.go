package integration

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	_ "github.com/jackc/pgx/v5/stdlib" // the raw pgx driver, for comparison

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/tagging"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// openBoth opens the same database through raw pgx and through pgtraffic.
func openBoth(t *testing.T, opts ...driver.Option) (raw, pgt *sql.DB, dsn string) {
	t.Helper()
	dsn = pgtest.Shared(t).CreateDatabase(t)
	raw, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	pgt, err = driver.Open(dsn, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close(); pgt.Close() })
	return raw, pgt, dsn
}

// querier is what *sql.DB, *sql.Tx and *sql.Conn have in common.
type querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// result is everything a caller can observe of a query: columns, their types, rows, error.
type result struct {
	Columns  []string
	DBTypes  []string
	Scan     []string
	Nullable []string
	Rows     [][]any
	Err      string
}

func collect(rows *sql.Rows, err error) result {
	if err != nil {
		return result{Err: errText(err)}
	}
	defer rows.Close()
	var r result
	r.Columns, _ = rows.Columns()
	cts, _ := rows.ColumnTypes()
	for _, ct := range cts {
		r.DBTypes = append(r.DBTypes, ct.DatabaseTypeName())
		r.Scan = append(r.Scan, fmt.Sprint(ct.ScanType()))
		n, ok := ct.Nullable()
		r.Nullable = append(r.Nullable, fmt.Sprint(n, ok))
	}
	for rows.Next() {
		vals := make([]any, len(r.Columns))
		ptrs := make([]any, len(vals))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return result{Err: errText(err)}
		}
		r.Rows = append(r.Rows, vals)
	}
	if err := rows.Err(); err != nil {
		r.Err = errText(err)
	}
	return r
}

// errText is an error as the caller sees it, with the SQLSTATE of server errors.
func errText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return "pg " + pgErr.Code + ": " + pgErr.Message
	}
	return err.Error()
}

// paths runs one query through every database/sql path of q's kind.
func paths(ctx context.Context, db *sql.DB) map[string]func(query string, args ...any) result {
	via := func(get func() (querier, func())) map[string]func(string, ...any) result {
		return map[string]func(string, ...any) result{
			"query": func(query string, args ...any) result {
				q, done := get()
				defer done()
				return collect(q.QueryContext(ctx, query, args...))
			},
			"prepared": func(query string, args ...any) result {
				q, done := get()
				defer done()
				st, err := q.PrepareContext(ctx, query)
				if err != nil {
					return result{Err: errText(err)}
				}
				defer st.Close()
				return collect(st.QueryContext(ctx, args...))
			},
		}
	}
	out := map[string]func(string, ...any) result{}
	for name, get := range map[string]func() (querier, func()){
		"db": func() (querier, func()) { return db, func() {} },
		"tx": func() (querier, func()) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				panic(err)
			}
			return tx, func() { tx.Rollback() }
		},
		"conn": func() (querier, func()) {
			c, err := db.Conn(ctx)
			if err != nil {
				panic(err)
			}
			return c, func() { c.Close() }
		},
	} {
		for kind, f := range via(get) {
			out[name+"/"+kind] = f
		}
	}
	return out
}

func TestPathsMatchRawPgx(t *testing.T) {
	ctx := context.Background()
	raw, pgt, _ := openBoth(t)
	for _, db := range []*sql.DB{raw, pgt} {
		if _, err := db.ExecContext(ctx, `create table if not exists items (id int primary key, name text, price numeric(10,2), tags text[], created timestamptz default '2026-01-01')`); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := raw.ExecContext(ctx, `insert into items values (1, 'a', 1.50, '{x,y}'), (2, null, null, null), (3, 'c', 3, '{}') on conflict do nothing`); err != nil {
		t.Fatal(err)
	}
	bigParams := make([]string, 500)
	bigArgs := make([]any, 500)
	for i := range bigParams {
		bigParams[i] = fmt.Sprintf("$%d::int", i+1)
		bigArgs[i] = i
	}
	mib := strings.Repeat("x", 1<<20)
	cases := []struct {
		name  string
		query string
		args  []any
	}{
		{"rows", "select id, name, price, tags, created from items order by id", nil},
		{"args", "select id, name from items where id = $1 or name = $2", []any{3, "a"}},
		{"nulls", "select null::int, null::text, $1::text", []any{nil}},
		{"500 params", "select " + strings.Join(bigParams, ", "), bigArgs},
		{"1 MiB literal", "select length('" + mib + "')", nil},
		{"1 MiB arg", "select length($1::text)", []any{mib}},
		{"empty query", "", nil},
		{"syntax error", "selec 1", nil},
		{"runtime error", "select 1/0", nil},
		{"no rows", "select id from items where false", nil},
	}
	rawPaths, pgtPaths := paths(ctx, raw), paths(ctx, pgt)
	for _, tc := range cases {
		for path := range rawPaths {
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				want := rawPaths[path](tc.query, tc.args...)
				got := pgtPaths[path](tc.query, tc.args...)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("pgtraffic differs from raw pgx\n got: %.300v\nwant: %.300v", got, want)
				}
			})
		}
	}
}

func TestExecPathsMatchRawPgx(t *testing.T) {
	ctx := context.Background()
	raw, pgt, _ := openBoth(t)
	if _, err := raw.ExecContext(ctx, `create table counters (id int primary key, n int)`); err != nil {
		t.Fatal(err)
	}
	exec := func(db *sql.DB) []string {
		var out []string
		note := func(res sql.Result, err error) {
			if err != nil {
				out = append(out, errText(err))
				return
			}
			n, err := res.RowsAffected()
			out = append(out, fmt.Sprint(n, err))
		}
		note(db.ExecContext(ctx, `truncate counters`))
		note(db.ExecContext(ctx, `insert into counters values (1, 0), (2, 0)`))
		note(db.ExecContext(ctx, `update counters set n = n + $1`, 5))
		note(db.ExecContext(ctx, `insert into counters values (1, 0)`)) // unique violation
		note(db.ExecContext(ctx, `update counters set n = n + 1; update counters set n = n + 1`))
		tx, _ := db.BeginTx(ctx, nil)
		note(tx.ExecContext(ctx, `update counters set n = n * 2 where id = $1`, 1))
		st, _ := tx.PrepareContext(ctx, `update counters set n = n + $1 where id = $2`)
		note(st.ExecContext(ctx, 10, 2))
		st.Close()
		if err := tx.Commit(); err != nil {
			out = append(out, err.Error())
		}
		c, _ := db.Conn(ctx)
		note(c.ExecContext(ctx, `update counters set n = n - 1`))
		c.Close()
		rows, _ := db.QueryContext(ctx, `select id, n from counters order by id`)
		r := collect(rows, nil)
		return append(out, fmt.Sprint(r.Rows))
	}
	want := exec(raw)
	got := exec(pgt)
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("pgtraffic differs from raw pgx\n got: %v\nwant: %v", got, want)
	}
	if got[len(got)-1] != "[[1 13] [2 16]]" {
		t.Fatalf("final state %s", got[len(got)-1])
	}
}

func TestSyntaxErrorIsServers(t *testing.T) {
	_, pgt, _ := openBoth(t)
	_, err := pgt.Exec("selec 1")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42601" {
		t.Fatalf("want the server's *pgconn.PgError 42601, got %T %v", err, err)
	}
	if errors.Is(err, driver.ErrBlocked) {
		t.Fatal("a syntax error is not a block")
	}
}

func TestCancelledContext(t *testing.T) {
	_, pgt, _ := openBoth(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := pgt.ExecContext(ctx, "select 1"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled before: %v", err)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := pgt.ExecContext(ctx, "select pg_sleep(5)"); err == nil {
		t.Fatal("a statement past its deadline succeeded")
	}
	// The pool is still usable afterwards.
	var n int
	if err := pgt.QueryRow("select 41 + 1").Scan(&n); err != nil || n != 42 {
		t.Fatalf("after cancel: %v %d", err, n)
	}
}

func TestServerRestartPoolRecovers(t *testing.T) {
	srv := privateServer(t)
	db, err := driver.Open(srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxIdleConns(4)
	var wg sync.WaitGroup
	for range 4 { // fill the pool with idle connections
		wg.Add(1)
		go func() { defer wg.Done(); db.Exec("select pg_sleep(0.05)") }()
	}
	wg.Wait()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// Idle connections are dead now; database/sql discards them (pgx reports ErrBadConn before
	// anything is sent) and the query succeeds on a fresh one within a few tries at most.
	var n int
	var lastErr error
	for range 5 {
		if lastErr = db.QueryRow("select 7").Scan(&n); lastErr == nil {
			break
		}
	}
	if lastErr != nil || n != 7 {
		t.Fatalf("after restart: %v", lastErr)
	}
}

func TestRawConn(t *testing.T) {
	ctx := context.Background()
	_, pgt, _ := openBoth(t)
	if _, err := pgt.Exec(`create table copied (id int, name text)`); err != nil {
		t.Fatal(err)
	}
	c, err := pgt.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = driver.RawConn(ctx, c, func(pc *pgx.Conn) error {
		n, err := pc.CopyFrom(ctx, pgx.Identifier{"copied"}, []string{"id", "name"},
			pgx.CopyFromRows([][]any{{1, "a"}, {2, "b"}, {3, "c"}}))
		if err == nil && n != 3 {
			err = fmt.Errorf("copied %d rows", n)
		}
		if err != nil {
			return err
		}
		if _, err := pc.Exec(ctx, "listen pgtraffic_test"); err != nil {
			return err
		}
		if _, err := pc.Exec(ctx, "select pg_notify('pgtraffic_test', 'hello')"); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		note, err := pc.WaitForNotification(wctx)
		if err != nil {
			return err
		}
		if note.Payload != "hello" {
			return fmt.Errorf("payload %q", note.Payload)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := c.QueryRowContext(ctx, "select count(*) from copied").Scan(&n); err != nil || n != 3 {
		t.Fatalf("count after CopyFrom: %d %v", n, err)
	}
}

// TestTagsPerStatement checks the merged tags the engine sees (its debug log): built-ins,
// comment tags, context tags, and that context wins over a comment.
func TestTagsPerStatement(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	_, pgt, _ := openBoth(t, driver.WithLogger(logger))
	if _, err := pgt.Exec(`create table orders (id int, tenant text)`); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	buf.Reset()
	mu.Unlock()
	ctx := tagging.With(context.Background(), "app", "checkout", "route", "/ctx")
	q := `select o.id from orders o join orders p on p.id = o.id where o.tenant = 'secret-tenant' /*route='%2Fcomment',controller='pay'*/`
	rows, err := pgt.QueryContext(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{
		`"app":"checkout"`, `"route":"/ctx"`, `"controller":"pay"`, `"statement":"select"`,
		`"table":"orders"`, `"username":"postgres"`, `"database":"`, `"fingerprint":"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("debug log lacks %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "/comment") {
		t.Errorf("comment tag won over context tag:\n%s", out)
	}
	if strings.Contains(out, "secret-tenant") {
		t.Errorf("a literal reached the log:\n%s", out)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestInterruptedConnsLeaveThePool: pgx closes a connection whose statement is interrupted by
// its context. pgtraffic reports such connections invalid when they return to the pool, so a
// small pool full of them does not fail the next statements with driver.ErrBadConn.
func TestInterruptedConnsLeaveThePool(t *testing.T) {
	_, pgt, _ := openBoth(t)
	pgt.SetMaxOpenConns(2)
	for round := range 3 {
		var wg sync.WaitGroup
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				defer cancel()
				pgt.ExecContext(ctx, "select pg_sleep(5)")
			}()
		}
		wg.Wait()
		if st := pgt.Stats(); st.Idle != 0 {
			t.Fatalf("round %d: %d interrupted (closed) connections kept idle in the pool", round, st.Idle)
		}
		var n int
		if err := pgt.QueryRow("select 1").Scan(&n); err != nil || n != 1 {
			t.Fatalf("round %d: after interrupted statements: %v", round, err)
		}
	}
}
