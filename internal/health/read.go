package health

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgerrcode"
)

// activeQueriesSQL counts client backends executing a statement, excluding
// the sampler's own (which is active while it runs this).
//
// PostgreSQL hides the state of other roles' backends from a role without
// pg_read_all_stats (which pg_monitor includes): their backend_type and state
// are NULL, and a count would leave them out, a 0 that says all is well while
// they run. A hidden backend that is connected to a database as a role (a
// client backend, a parallel worker, a logical walsender) and holds a snapshot
// or a transaction ID, as one running a statement does, makes the query
// return no row, a failed read (errActiveHidden). Hidden backends that hold
// neither (idle sessions, such as other applications' pooled connections) run
// no statement and leave the count exact. One scan of pg_stat_activity, as
// the count alone, and the statement still reads, in pg_stat_activity, as
// the count it is.
const activeQueriesSQL = `select count(*) from pg_stat_activity ` +
	`where (state = 'active' and backend_type = 'client backend' and pid <> pg_backend_pid()) ` +
	`or (backend_type is null and datid is not null and usesysid is not null ` +
	`and (backend_xmin is not null or backend_xid is not null)) ` +
	`having count(*) filter (where backend_type is null) = 0`

// errActiveHidden replaces the missing row of activeQueriesSQL while other
// roles' backends whose state the sampling role cannot see may be running
// statements.
var errActiveHidden = ResultError{"unknown: backends of other roles may be running statements, and the " +
	"sampling role cannot see their state in pg_stat_activity (grant it pg_read_all_stats or pg_monitor)"}

// replicationLagSQL works on a standby and on a primary, so that a failover
// needs no reconfiguration.
//
// On a standby it is the age of the last replayed transaction, except that a
// standby streaming from its primary that has replayed everything it received
// is caught up: 0 (an idle primary writes no transactions, and the age alone
// would grow forever). Only a streaming WAL receiver (pg_stat_wal_receiver,
// PostgreSQL 9.6+) knows there is nothing more to receive: a standby cut off
// from its primary has replayed all it received too, while the primary goes
// on committing, so without one (cut off, reconnecting, or fed from a WAL
// archive alone) it reports the age, which grows until it streams again.
//
// The query returns NULL, which reads as a failed read (errLagUnknown), not as
// 0, when the standby is not known to be caught up and has replayed no
// transaction since it started (there is no age to report), and when the
// sampling role cannot see the WAL receiver's status (PostgreSQL shows it only
// to roles with pg_read_all_stats, which pg_monitor includes): a caught-up
// standby then cannot be told from a cut-off one.
//
// On a primary it is the largest replay_lag among its standbys, 0 when there
// is none (or when each is caught up: replay_lag is then NULL); NULL, a failed
// read, when the sampling role cannot see them (their state is NULL to a role
// without pg_read_all_stats), rather than a 0 that would say all is well. A
// standby that lost its connection is not among them: a primary cannot tell
// its lag. Negative ages (clock skew) read as 0.
const replicationLagSQL = `select case when pg_is_in_recovery() then case ` +
	`when (select status = 'streaming' from pg_stat_wal_receiver) ` +
	`and pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn() then 0 ` +
	`when exists (select 1 from pg_stat_wal_receiver where status is null) then null ` +
	`else greatest(extract(epoch from now() - pg_last_xact_replay_timestamp()), 0) end ` +
	`when exists (select 1 from pg_stat_replication where state is null) then null ` +
	`else coalesce((select extract(epoch from max(replay_lag)) from pg_stat_replication), 0) ` +
	`end::float8`

// errLagUnknown replaces the NULL that replicationLagSQL returns for a
// standby whose lag cannot be known.
var errLagUnknown = ResultError{"unknown: the standby is not known to be caught up and has replayed no transaction " +
	"since it started, or the sampling role cannot see the replication's state (pg_stat_wal_receiver on a " +
	"standby, pg_stat_replication on a primary: grant it pg_monitor)"}

// setupSQL names the session so that it is visible in pg_stat_activity, and
// sets a server-side statement_timeout at two thirds of the client's read
// timeout: the server then cancels a slow read itself and the connection
// survives, where a client-side deadline has to break it (a client interrupts
// a read by setting a deadline on its socket). The last third leaves time for
// the cancellation to come back from a busy server.
const setupSQL = `select set_config('application_name', $1, false), set_config('statement_timeout', $2, false)`

// describe says why a read failed, clearly but without the server's message
// text, which can quote literals from the query; the SQLSTATE names the
// condition exactly.
func describe(err error, timeout time.Duration) string {
	var result ResultError
	var server interface{ SQLState() string }
	switch {
	case errors.As(err, &result):
		return result.Problem
	case errors.As(err, &server):
		code := server.SQLState()
		if code == pgerrcode.QueryCanceled {
			return fmt.Sprintf("timed out after %s (server canceled the statement, SQLSTATE %s)",
				timeout, pgerrcode.QueryCanceled)
		}
		return fmt.Sprintf("server error SQLSTATE %s (%s)", code, conditionName(code))
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrTimeout):
		return fmt.Sprintf("timed out after %s", timeout)
	default:
		return err.Error()
	}
}

// conditionName names the SQLSTATEs a health query most often meets, and
// otherwise the class.
func conditionName(code string) string {
	switch code {
	case pgerrcode.SyntaxError:
		return "syntax_error"
	case pgerrcode.InsufficientPrivilege:
		return "insufficient_privilege"
	case pgerrcode.UndefinedTable:
		return "undefined_table"
	case pgerrcode.UndefinedColumn:
		return "undefined_column"
	case pgerrcode.UndefinedFunction:
		return "undefined_function"
	case pgerrcode.FeatureNotSupported:
		return "feature_not_supported"
	case pgerrcode.ReadOnlySQLTransaction:
		return "read_only_sql_transaction"
	}
	if len(code) < 2 {
		return "unknown"
	}
	switch code[:2] {
	case "08":
		return "connection exception"
	case "22":
		return "data exception"
	case "28":
		return "invalid authorization"
	case "42":
		return "syntax error or access rule violation"
	case "53":
		return "insufficient resources"
	case "54":
		return "program limit exceeded"
	case "55":
		return "object not in prerequisite state"
	case "57":
		return "operator intervention"
	case "58":
		return "system error"
	case "XX":
		return "internal error"
	}
	return "class " + code[:2]
}
