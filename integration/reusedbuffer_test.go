package integration

import (
	"context"
	"testing"
	"unsafe"
)

// TestReusedBufferDeleteBlocked: a query builder that reuses one buffer and hands database/sql
// its text through unsafe.String sends a SELECT, then an unqualified DELETE of the same length
// from the same storage. pgtraffic knows a text by its content: the require_where guard blocks
// the DELETE and no row is lost.
func TestReusedBufferDeleteBlocked(t *testing.T) {
	_, db := openRules(t, `
guards:
  require_where: enforce
`)
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `create table t (id int primary key);
		insert into t select g from generate_series(1, 20) g`); err != nil {
		t.Fatal(err)
	}
	const sel, del = "SELECT * FROM t", "DELETE   FROM t"
	buf := []byte(sel)
	q := unsafe.String(&buf[0], len(buf))
	for range 3 {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("SELECT: %v", err)
		}
	}
	copy(buf, del)
	_, err := db.ExecContext(ctx, q)
	if be := asBlocked(t, err); be.Rule != "require_where" {
		t.Fatalf("DELETE from the reused buffer: %+v, want a require_where block", be)
	}
	var n int
	if err := db.QueryRowContext(ctx, `select count(*) from t`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 20 {
		t.Fatalf("%d rows left of 20: the DELETE ran", n)
	}
}
