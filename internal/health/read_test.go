package health

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestDescribe(t *testing.T) {
	const timeout = 500 * time.Millisecond
	tests := []struct {
		name, want string
		err        error
		mustNot    string
	}{
		{name: "shape", err: ResultError{"returned 2 columns, want one number"}, want: "returned 2 columns, want one number"},
		{name: "NULL", err: fmt.Errorf("read: %w", ErrNull), want: "returned NULL, want a number"},
		{
			name:    "server error: code and condition, never the message",
			err:     fmt.Errorf("wrapped: %w", &serverError{code: "22P02", msg: `invalid input syntax for type integer: "s3cr3t"`}),
			want:    "server error SQLSTATE 22P02 (data exception)",
			mustNot: "s3cr3t",
		},
		{name: "named condition", err: &serverError{code: "42P01", msg: `relation "x" does not exist`}, want: "server error SQLSTATE 42P01 (undefined_table)"},
		{name: "statement_timeout", err: &serverError{code: "57014"}, want: "timed out after 500ms (server canceled the statement, SQLSTATE 57014)"},
		{name: "client deadline", err: fmt.Errorf("read: %w", context.DeadlineExceeded), want: "timed out after 500ms"},
		{name: "marked timeout", err: fmt.Errorf("%w: read tcp: i/o timeout", ErrTimeout), want: "timed out after 500ms"},
		{name: "unknown class", err: &serverError{code: "P0001"}, want: "server error SQLSTATE P0001 (class P0)"},
		{name: "other", err: errors.New("unexpected EOF"), want: "unexpected EOF"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := describe(tt.err, timeout)
			if got != tt.want {
				t.Errorf("describe = %q, want %q", got, tt.want)
			}
			if tt.mustNot != "" && strings.Contains(got, tt.mustNot) {
				t.Errorf("describe leaked %q: %q", tt.mustNot, got)
			}
		})
	}
}
