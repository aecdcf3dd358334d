package pgxconn

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/internal/serverclock"
)

var _ serverclock.Conn = (*Conn)(nil)

// readSQL reads the counters of the asked query identifiers: top-level statements of this
// database, one row per identifier and role (each its own entry, reset or evicted on its own),
// without their texts (pg_stat_statements(false) skips the text file). The identifiers are
// joined, not searched (queryid = any($1) compares each entry with every identifier). The
// lateral join keeps one row, with the reset stamp and the eviction count, when none matches.
// The two %s are pg_stat_statements_info and pg_stat_statements qualified with the extension's
// schema: the connection copies the application's settings, whose search_path need not
// include it.
const readSQL = `select i.stats_reset, i.dealloc, s.queryid, s.userid, s.calls, s.total_exec_time, s.total_plan_time
from %s i
left join lateral (
	select p.queryid, p.userid, p.calls, p.total_exec_time, p.total_plan_time
	from %s(false) p
	join pg_catalog.unnest($1::int8[]) as q(id) on p.queryid = q.id
	where p.toplevel and p.dbid = (select oid from pg_catalog.pg_database where datname = pg_catalog.current_database())
) s on true`

// schemaSQL finds the schema pg_stat_statements was created in, in this database.
const schemaSQL = `select n.nspname from pg_catalog.pg_extension e
join pg_catalog.pg_namespace n on n.oid = e.extnamespace
where e.extname = 'pg_stat_statements'`

// Connector returns a serverclock Options.Connect that opens a connection from a copy of cfg
// each time (pgx.ConnectConfig must not be handed one config twice) with dial (nil:
// pgx.ConnectConfig; see the health package's pgxconn.Dial), named
// serverclock.ApplicationName, whose statements the server ends after
// serverclock.StatementTimeout.
func Connector(cfg *pgx.ConnConfig, dial func(context.Context, *pgx.ConnConfig) (*pgx.Conn, error)) func(ctx context.Context) (serverclock.Conn, error) {
	cfg = cfg.Copy()
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = serverclock.ApplicationName
	cfg.RuntimeParams["statement_timeout"] = serverclock.StatementTimeout
	if dial == nil {
		dial = pgx.ConnectConfig
	}
	return func(ctx context.Context) (serverclock.Conn, error) {
		c, err := dial(ctx, cfg.Copy())
		if err != nil {
			return nil, err
		}
		return &Conn{c: c}, nil
	}
}

// Conn is a serverclock.Conn over a pgx connection; like it, not safe for concurrent use.
type Conn struct {
	c   *pgx.Conn
	sql string // readSQL in the extension's schema; "" until found, and again after a failed read
}

// Ping sends an empty query.
func (c *Conn) Ping(ctx context.Context) error { return c.c.PgConn().Ping(ctx) }

// Read reads pg_stat_statements' counters of ids.
func (c *Conn) Read(ctx context.Context, ids []int64) (serverclock.Reading, error) {
	out, err := c.read(ctx, ids)
	if err != nil {
		c.sql = "" // the extension may have been dropped, or created again elsewhere
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && unavailable[pgErr.Code] {
		err = fmt.Errorf("%w: %w", serverclock.ErrUnavailable, err)
	}
	return out, err
}

// unavailable are the SQLSTATEs of a server without a readable pg_stat_statements: undefined
// table or function (the extension not created), insufficient privilege, object not in
// prerequisite state (not in shared_preload_libraries), invalid schema.
var unavailable = map[string]bool{
	pgerrcode.UndefinedTable: true, pgerrcode.UndefinedFunction: true, pgerrcode.InsufficientPrivilege: true,
	pgerrcode.ObjectNotInPrerequisiteState: true, pgerrcode.InvalidSchemaName: true,
}

func (c *Conn) read(ctx context.Context, ids []int64) (serverclock.Reading, error) {
	if c.sql == "" {
		var schema string
		err := c.c.QueryRow(ctx, schemaSQL).Scan(&schema)
		if errors.Is(err, pgx.ErrNoRows) {
			return serverclock.Reading{}, fmt.Errorf("%w: the extension is not created in this database", serverclock.ErrUnavailable)
		}
		if err != nil {
			return serverclock.Reading{}, err
		}
		c.sql = fmt.Sprintf(readSQL, pgx.Identifier{schema, "pg_stat_statements_info"}.Sanitize(),
			pgx.Identifier{schema, "pg_stat_statements"}.Sanitize())
	}
	rows, err := c.c.Query(ctx, c.sql, ids)
	if err != nil {
		return serverclock.Reading{}, err
	}
	defer rows.Close()
	var out serverclock.Reading
	for rows.Next() {
		var (
			reset              *time.Time
			dealloc, id, calls *int64
			user               *uint32
			exec, plan         *float64
		)
		if err := rows.Scan(&reset, &dealloc, &id, &user, &calls, &exec, &plan); err != nil {
			return serverclock.Reading{}, err
		}
		if reset != nil {
			out.Reset = *reset
		}
		if dealloc != nil {
			out.Dealloc = *dealloc
		}
		if id == nil || user == nil || calls == nil || exec == nil {
			continue // no identifier matched
		}
		r := serverclock.Row{QueryID: *id, UserID: *user, Calls: *calls, ExecMS: *exec}
		if plan != nil {
			r.PlanMS = *plan
		}
		out.Rows = append(out.Rows, r)
	}
	return out, rows.Err()
}

// IsClosed reports whether the connection is closed.
func (c *Conn) IsClosed() bool { return c.c.IsClosed() }

// Close closes the connection.
func (c *Conn) Close(ctx context.Context) error { return c.c.Close(ctx) }
