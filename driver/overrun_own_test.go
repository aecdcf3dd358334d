package driver

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestOwnErrors: the errors a statement answers whatever its timing are its own, never an
// overrun; what a cancellation leaves is not.
func TestOwnErrors(t *testing.T) {
	closed := &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	for _, tc := range []struct {
		err error
		own bool
	}{
		{&pgconn.PgError{Code: "22012"}, true}, // division by zero
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42P01"}), true},
		{pgx.ScanArgError{ColumnIndex: 0, Err: errors.New("cannot scan NULL into *int")}, true},
		{&pgconn.PgError{Code: "57014"}, false}, // query_canceled: pgx's cancel request
		{context.DeadlineExceeded, false},
		{fmt.Errorf("timeout: %w", context.DeadlineExceeded), false},
		{closed, false}, // a connection pgx closed under a statement that did not stop (a copy)
		{driver.ErrBadConn, false},
	} {
		if got := own(tc.err); got != tc.own {
			t.Errorf("own(%v) = %v, want %v", tc.err, got, tc.own)
		}
	}
}
