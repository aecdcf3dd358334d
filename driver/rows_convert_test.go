package driver

import (
	"context"
	"database/sql/driver"
	"errors"
	"testing"
)

// convertConn is a fakeConn whose rows fail to convert their first row, as pgx's stdlib rows
// do for a value they cannot convert: the statement's other rows are still on the
// connection, and Close drains them. The rows record, in Close, whether the statement's
// context was already cancelled and how many statements the budget held in flight.
type convertConn struct {
	fakeConn
	c                  *Connector
	cancelledAtDrain   bool
	inFlightAtDrain    int
	drained, nextCalls int
}

var errConvert = errors.New("convert field 0 failed: cannot convert")

func (cc *convertConn) QueryContext(ctx context.Context, _ string, _ []driver.NamedValue) (driver.Rows, error) {
	return &convertRows{ctx: ctx, cc: cc}, nil
}

type convertRows struct {
	ctx context.Context
	cc  *convertConn
}

func (r *convertRows) Columns() []string { return []string{"x"} }
func (r *convertRows) Next([]driver.Value) error {
	r.cc.nextCalls++
	return errConvert
}
func (r *convertRows) Close() error {
	r.cc.drained++
	r.cc.cancelledAtDrain = r.ctx.Err() != nil
	r.cc.inFlightAtDrain = r.cc.c.Snapshot().Budgets[0].InFlight
	return nil
}

// TestRowConversionErrorDrainsBeforeFinishing: when a row fails to convert, the statement is
// not over: database/sql closes the rows, which drains the rest of the statement from the
// connection. That drain runs under the statement's context, still bounded by its
// max_duration but not cancelled (a cancelled one would make pgx close the connection), and
// with the statement's slot still held; the statement finishes after it, as a failure.
func TestRowConversionErrorDrainsBeforeFinishing(t *testing.T) {
	cc := &convertConn{}
	c, db := fakeDB(t, `
budgets:
  - {name: one, mode: enforce, max_concurrent: 1, max_duration: 10s}
rules:
  - {budget: one, match: {statement: select}}
`, cc)
	cc.c = c
	rows, err := db.QueryContext(context.Background(), "select x from t")
	if err != nil {
		t.Fatal(err)
	}
	if rows.Next() {
		t.Fatal("Next reported a row that failed to convert")
	}
	if err := rows.Err(); !errors.Is(err, errConvert) {
		t.Fatalf("rows.Err() = %v, want the conversion error", err)
	}
	rows.Close()
	if cc.drained != 1 {
		t.Fatalf("the rows were closed %d times, want 1", cc.drained)
	}
	if cc.cancelledAtDrain {
		t.Error("the rows were drained under a cancelled context: pgx would close the connection")
	}
	if cc.inFlightAtDrain != 1 {
		t.Errorf("budget in flight while the statement drained: %d, want 1 (its slot still held)", cc.inFlightAtDrain)
	}
	if got := c.Snapshot().Budgets[0].InFlight; got != 0 {
		t.Errorf("budget in flight after Close: %d, want 0", got)
	}
}
