package pgxconn

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/internal/health"
)

func TestToFloat(t *testing.T) {
	tests := []struct {
		name    string
		in      any
		want    float64
		wantErr error // nil for success
	}{
		{"int2", int16(-3), -3, nil},
		{"int4", int32(7), 7, nil},
		{"int8", int64(1 << 40), 1 << 40, nil},
		{"float4", float32(1.5), 1.5, nil},
		{"float8", 2.25, 2.25, nil},
		{"float8 infinity", math.Inf(1), math.Inf(1), nil},
		{"numeric", pgtype.Numeric{Int: big.NewInt(125), Exp: -2, Valid: true}, 1.25, nil},
		{"numeric infinity", pgtype.Numeric{InfinityModifier: pgtype.Infinity, Valid: true}, math.Inf(1), nil},
		{"NULL", nil, 0, health.ErrNull},
		{"numeric NULL", pgtype.Numeric{}, 0, health.ErrNull},
		{"float NaN", math.NaN(), 0, health.ResultError{Problem: "returned NaN, want a number"}},
		{"numeric NaN", pgtype.Numeric{NaN: true, Valid: true}, 0, health.ResultError{Problem: "returned NaN, want a number"}},
		// -Infinity, like NaN, is below every threshold: it would never throttle.
		{"float -infinity", math.Inf(-1), 0, health.ResultError{Problem: "returned -Infinity, want a number"}},
		{"numeric -infinity", pgtype.Numeric{InfinityModifier: pgtype.NegativeInfinity, Valid: true}, 0,
			health.ResultError{Problem: "returned -Infinity, want a number"}},
		// Out of float8's range: refused without quoting the value.
		{"numeric out of range", pgtype.Numeric{Int: big.NewInt(1), Exp: 400, Valid: true}, 0,
			health.ResultError{Problem: "returned a numeric beyond float8's range"}},
		{"text", "12", 0, errNotNumber},
		{"bool", true, 0, errNotNumber},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := toFloat(tt.in)
			switch {
			case !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil):
				t.Fatalf("toFloat(%v) error %v, want %v", tt.in, err, tt.wantErr)
			case got != tt.want:
				t.Fatalf("toFloat(%v) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// TestErrorsInHealthTerms: what the sampler describes an error by survives the translation; a
// server error keeps its SQLSTATE, and a pgconn timeout (here a connect whose context has
// expired, which needs no server) matches health.ErrTimeout with its text and chain intact.
func TestErrorsInHealthTerms(t *testing.T) {
	var server interface{ SQLState() string }
	pgErr := fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "42P01", Message: `relation "x" does not exist`})
	if err := inHealthTerms(pgErr); !errors.As(err, &server) || server.SQLState() != "42P01" || errors.Is(err, health.ErrTimeout) {
		t.Errorf("a server error in health's terms = %v; want its SQLSTATE 42P01 and no timeout", err)
	}
	if err := inHealthTerms(nil); err != nil {
		t.Errorf("inHealthTerms(nil) = %v", err)
	}
	other := errors.New("unexpected EOF")
	if err := inHealthTerms(other); err != other {
		t.Errorf("inHealthTerms(%v) = %v, want it unchanged", other, err)
	}

	cfg, err := pgx.ParseConfig("postgres://u@127.0.0.1:1/db?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	conn, err := Connector(cfg, nil)(ctx)
	if conn != nil || !errors.Is(err, health.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) || !pgconn.Timeout(err) {
		t.Fatalf("a connect past its deadline = (%v, %v); want a nil Conn and an error matching ErrTimeout, DeadlineExceeded and pgconn.Timeout", conn, err)
	}
	if strings.Contains(err.Error(), health.ErrTimeout.Error()) {
		t.Errorf("the timeout mark changed the error's text: %q", err)
	}
}
