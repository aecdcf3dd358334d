package health

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

func TestToFloat(t *testing.T) {
	tests := []struct {
		name    string
		in      any
		want    float64
		wantErr string // "" for success; errNotNumber's text for a non-number type
	}{
		{"int2", int16(-3), -3, ""},
		{"int4", int32(7), 7, ""},
		{"int8", int64(1 << 40), 1 << 40, ""},
		{"float4", float32(1.5), 1.5, ""},
		{"float8", 2.25, 2.25, ""},
		{"float8 infinity", math.Inf(1), math.Inf(1), ""},
		{"numeric", pgtype.Numeric{Int: big.NewInt(125), Exp: -2, Valid: true}, 1.25, ""},
		{"numeric infinity", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, math.Inf(1), ""},
		{"NULL", nil, 0, "returned NULL"},
		{"numeric NULL", pgtype.Numeric{}, 0, "returned NULL"},
		{"float NaN", math.NaN(), 0, "returned NaN"},
		{"numeric NaN", pgtype.Numeric{NaN: true, Valid: true}, 0, "returned NaN"},
		{"text", "12", 0, errNotNumber.Error()},
		{"bool", true, 0, errNotNumber.Error()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := toFloat(tt.in)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("toFloat(%v) error %v", tt.in, err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("toFloat(%v) error %v, want one containing %q", tt.in, err, tt.wantErr)
			case got != tt.want:
				t.Fatalf("toFloat(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestDescribe(t *testing.T) {
	const timeout = 500 * time.Millisecond
	tests := []struct {
		name, want string
		err        error
		mustNot    string
	}{
		{name: "shape", err: &shapeError{"returned 2 columns, want one number"}, want: "returned 2 columns, want one number"},
		{
			name:    "server error: code and condition, never the message",
			err:     fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "s3cr3t"`}),
			want:    "server error SQLSTATE 22P02 (data exception)",
			mustNot: "s3cr3t",
		},
		{name: "named condition", err: &pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`}, want: "server error SQLSTATE 42P01 (undefined_table)"},
		{name: "statement_timeout", err: &pgconn.PgError{Code: "57014"}, want: "timed out after 500ms (server canceled the statement, SQLSTATE 57014)"},
		{name: "client deadline", err: fmt.Errorf("read: %w", context.DeadlineExceeded), want: "timed out after 500ms"},
		{name: "unknown class", err: &pgconn.PgError{Code: "P0001"}, want: "server error SQLSTATE P0001 (class P0)"},
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
