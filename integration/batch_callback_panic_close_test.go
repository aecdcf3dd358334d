package integration

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestBatchCallbackPanicThenDeferredClose (run with -race): pgx's BatchResults.Close "is
// safe to call multiple times", and the README's FAQ says of a panic in the application's code
// that it "reaches the statement's caller, as a panic in a pgx tracer does ... What the statement
// held (its budgets' slots, the cost it reserved, the pool connection it took) is given back
// first". The usual shape of a handler is `br := pool.SendBatch(ctx, b); defer br.Close(); ...;
// return br.Close()`, and net/http recovers a handler's panic. When a QueuedQuery callback
// panics inside the explicit Close, pgtraffic gives the pool connection back while pgx's batch
// results are still mid-read on it, and pgxpool destroys the busy connection on a goroutine of
// its own (conn.Close): the handler's deferred br.Close() must not go on reading the pipeline
// on the very same *pgx.Conn (the race detector caught pgconn.(*PgConn).unlock against
// pgconn.(*PgConn).IsClosed in pgxpool's destructor), and nothing may stay acquired.
func TestBatchCallbackPanicThenDeferredClose(t *testing.T) {
	p := pendingPool(t, 2, `budgets: [{name: b, mode: enforce, max_concurrent: 2}]
rules: [{budget: b, match: {app: x}}]
`)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := &pgx.Batch{}
		b.Queue("select 1")
		b.Queue("select 2").QueryRow(func(pgx.Row) error {
			panic("a bug in the application's callback")
		})
		b.Queue("select generate_series(1, 1000)")
		br := p.SendBatch(pendingCtx, b)
		defer br.Close() // pgx: "Close is safe to call multiple times"
		if err := br.Close(); err != nil {
			http.Error(w, err.Error(), 500)
		}
	})
	srv := httptest.NewServer(handler)
	defer srv.Close()
	for i := 0; i < 3; i++ {
		resp, err := http.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
	}
	rvIdle(t, p, "b")
}
