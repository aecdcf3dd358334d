package pgxconn

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgtraffic/pgtraffic/internal/health"
)

var _ health.Conn = (*Conn)(nil)

// Dial makes a connection from cfg, a copy of its own, as the application's connections are
// made: through the front end's connection hooks (a password or token set per connection by
// pgxpool's BeforeConnect or stdlib's OptionBeforeConnect), so that credentials that rotate
// reach pgtraffic's own connections too. nil is pgx.ConnectConfig.
type Dial func(ctx context.Context, cfg *pgx.ConnConfig) (*pgx.Conn, error)

// connect makes a connection from a copy of cfg (pgx.ConnectConfig must not be handed one
// config twice) with dial.
func connect(ctx context.Context, dial Dial, cfg *pgx.ConnConfig) (*pgx.Conn, error) {
	if dial == nil {
		dial = pgx.ConnectConfig
	}
	return dial(ctx, cfg.Copy())
}

// Connector returns a [health.Options] Connect that opens a connection from a copy of cfg
// each time, with dial.
func Connector(cfg *pgx.ConnConfig, dial Dial) func(ctx context.Context) (health.Conn, error) {
	return func(ctx context.Context) (health.Conn, error) {
		c, err := connect(ctx, dial, cfg)
		if err != nil {
			return nil, inHealthTerms(err)
		}
		return &Conn{c: c}, nil
	}
}

// Conn is a [health.Conn] over a pgx connection. Like the *pgx.Conn it wraps, it is not safe
// for concurrent use; the sampler uses it from one round at a time.
type Conn struct{ c *pgx.Conn }

// Exec runs sql with args and discards its result.
func (c *Conn) Exec(ctx context.Context, sql string, args ...any) error {
	_, err := c.c.Exec(ctx, sql, args...)
	return inHealthTerms(err)
}

// ReadNumber runs sql and returns its single numeric value.
func (c *Conn) ReadNumber(ctx context.Context, sql string) (float64, error) {
	v, err := c.readNumber(ctx, sql)
	return v, inHealthTerms(err)
}

func (c *Conn) readNumber(ctx context.Context, sql string) (float64, error) {
	rows, err := c.c.Query(ctx, sql)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, health.ErrNoRows
	}
	fields := rows.FieldDescriptions()
	if len(fields) != 1 {
		return 0, health.ResultError{Problem: fmt.Sprintf("returned %d columns, want one number", len(fields))}
	}
	values, err := rows.Values()
	if err != nil {
		return 0, err
	}
	v, err := toFloat(values[0])
	if err != nil {
		if errors.Is(err, errNotNumber) {
			return 0, health.ResultError{Problem: fmt.Sprintf("returned a column of type %s, want int2, int4, int8, float4, float8 or numeric",
				c.typeName(fields[0].DataTypeOID))}
		}
		return 0, err
	}
	if rows.Next() {
		return 0, health.ResultError{Problem: "returned more than one row, want one"}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	return v, nil
}

// IsClosed reports whether the connection is closed.
func (c *Conn) IsClosed() bool { return c.c.IsClosed() }

// Close closes the connection.
func (c *Conn) Close(ctx context.Context) error { return inHealthTerms(c.c.Close(ctx)) }

var errNotNumber = errors.New("pgxconn: not a number type")

// toFloat converts a decoded value of a numeric column. NaN and -Infinity are refused: they
// are below every threshold (NaN compares false with all), so they would never throttle. So
// is a numeric beyond float8's range, whose error would quote it.
func toFloat(v any) (float64, error) {
	var f float64
	switch x := v.(type) {
	case nil:
		return 0, health.ErrNull
	case int16:
		f = float64(x)
	case int32:
		f = float64(x)
	case int64:
		f = float64(x)
	case float32:
		f = float64(x)
	case float64:
		f = x
	case pgtype.Numeric:
		if !x.Valid {
			return 0, health.ErrNull
		}
		if x.NaN {
			f = math.NaN()
			break
		}
		f8, err := x.Float64Value()
		if err != nil {
			return 0, health.ResultError{Problem: "returned a numeric beyond float8's range"}
		}
		f = f8.Float64
	default:
		return 0, errNotNumber
	}
	switch {
	case math.IsNaN(f):
		return 0, health.ResultError{Problem: "returned NaN, want a number"}
	case math.IsInf(f, -1):
		return 0, health.ResultError{Problem: "returned -Infinity, want a number"}
	}
	return f, nil
}

// typeName names a column type for an error message.
func (c *Conn) typeName(oid uint32) string {
	if t, ok := c.c.TypeMap().TypeForOID(oid); ok {
		return t.Name
	}
	return fmt.Sprintf("oid %d", oid)
}

// inHealthTerms marks pgconn's timeouts with health.ErrTimeout; every other error, a
// *pgconn.PgError included, is returned as it is.
func inHealthTerms(err error) error {
	if err != nil && pgconn.Timeout(err) {
		return timeoutError{err}
	}
	return err
}

// timeoutError is a pgconn timeout, which matches health.ErrTimeout and keeps its text and
// chain.
type timeoutError struct{ err error }

func (e timeoutError) Error() string        { return e.err.Error() }
func (e timeoutError) Unwrap() error        { return e.err }
func (e timeoutError) Is(target error) bool { return target == health.ErrTimeout }

// systemIDSQL reads the cluster's system identifier: chosen by initdb, kept by its physical
// replicas, and readable by every role that may connect (EXECUTE on pg_control_system is
// PUBLIC's unless an administrator revoked it).
const systemIDSQL = "select system_identifier::text from pg_control_system()"

// SystemID returns a func that reads the cluster's system identifier on a connection of its own
// made from a copy of cfg with dial, closed before it returns: the secret the health sampler
// election signs its samples with (what an instance that can read the database knows and
// Redis does not hold).
func SystemID(cfg *pgx.ConnConfig, dial Dial) func(ctx context.Context) (string, error) {
	return func(ctx context.Context) (string, error) {
		c, err := connect(ctx, dial, cfg)
		if err != nil {
			return "", err
		}
		var id string
		err = c.QueryRow(ctx, systemIDSQL).Scan(&id)
		cctx, cancel := context.WithTimeout(context.Background(), health.CloseTimeout)
		c.Close(cctx)
		cancel()
		if err != nil {
			return "", err
		}
		if id == "" || id == "0" {
			return "", errors.New("pgxconn: the server reported no system identifier")
		}
		return id, nil
	}
}
