package driver

import (
	"context"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// maxPreparedNames bounds the names a pool keeps (preparedNames). pgx keeps each prepared
// statement's text on every connection; the pool keeps one copy of each.
const maxPreparedNames = 1000

// preparedNames maps the names of the statements prepared on a [Pool]'s connections, by its
// AfterConnect hook or in its transactions, to their texts, pool-wide: pgx runs such a
// statement when its name is passed as the SQL, and the engine must decide the text the server
// runs, not the name. A statement of the pool is decided before it has a connection, so the
// names are the pool's, not a connection's: a name prepared with different texts (on two
// connections, or one after the other) is decided as the name, for good, as is a name beyond
// the first maxPreparedNames.
//
// The zero value is empty and ready; log must be set before the first name is recorded. It is
// safe for concurrent use: a statement reads the names with one atomic load (and nothing more
// while there are none), new connections and prepares record them.
type preparedNames struct {
	table atomic.Pointer[nameTable] // never changed once stored; nil while no name is known
	log   *slog.Logger
	// pending is set while the pool's AfterConnect hook has run on no connection: the names are
	// not known yet (Pool.ready).
	pending atomic.Bool

	mu   sync.Mutex // serialises the writers (record), and protects the field below
	full bool       // a name was left out (logged once)
}

// nameTable is one version of a pool's names. Its methods take a nil table as an empty one.
type nameTable struct {
	texts  map[string]string // name -> text; a name that maps to itself is decided as itself
	maxLen int               // the longest name: a longer SQL text names no statement
}

func (t *nameTable) lookup(name string) (string, bool) {
	if t == nil || len(name) > t.maxLen {
		return "", false
	}
	text, ok := t.texts[name]
	return text, ok
}

func (t *nameTable) len() int {
	if t == nil {
		return 0
	}
	return len(t.texts)
}

func (t *nameTable) clone() *nameTable {
	if t == nil {
		return &nameTable{texts: map[string]string{}}
	}
	return &nameTable{texts: maps.Clone(t.texts), maxLen: t.maxLen}
}

// text is the text sql is decided as: the text of the statement sql names, else sql. p may be
// nil (a database/sql connection's statement): no names.
func (p *preparedNames) text(sql string) string {
	if p == nil {
		return sql
	}
	if text, ok := p.table.Load().lookup(sql); ok {
		return text
	}
	return sql
}

// preparedStmt is a statement prepared on a connection: its name and its text.
type preparedStmt struct{ name, text string }

// record adds the statements prepared on one connection.
func (p *preparedNames) record(stmts ...preparedStmt) {
	var conflicts []string
	dropped := false
	p.mu.Lock()
	cur := p.table.Load()
	var next *nameTable // a copy of cur with the changes, once there is one
	for _, s := range stmts {
		known := cur
		if next != nil {
			known = next
		}
		old, ok := known.lookup(s.name)
		switch {
		case ok && (old == s.text || old == s.name):
			continue
		case ok:
			// Which text a statement runs depends on the connection it gets.
			conflicts = append(conflicts, s.name)
			s.text = s.name
		case known.len() >= maxPreparedNames:
			dropped = dropped || !p.full
			p.full = true
			continue
		}
		if next == nil {
			next = cur.clone()
		}
		next.texts[s.name] = s.text
		next.maxLen = max(next.maxLen, len(s.name))
	}
	if next != nil {
		p.table.Store(next)
	}
	p.mu.Unlock()
	// The logger's handler is the application's: called with the lock released.
	for _, name := range conflicts {
		p.log.Warn("pgtraffic: a statement name is prepared with different texts on the pool's connections; "+
			"statements run by this name are decided as the name", "name", name)
	}
	if dropped {
		p.log.Warn("pgtraffic: too many prepared statement names; statements run by a name not kept are decided as the name",
			"kept", maxPreparedNames)
	}
}

// preparedSQL lists the statements prepared on a connection through the protocol (pgx's
// Prepare), which pgx runs by their name; those of SQL PREPARE run as the text EXECUTE name.
const preparedSQL = `select name, statement from pg_prepared_statements where not from_sql`

// learn records the statements prepared on conn (by the pool's AfterConnect hook). It reads
// them through pgconn, out of the reach of the application's tracer and of pgx's statement
// cache. A failed read (a server without the view) never fails the connection: it is logged,
// and the statements run by those names are decided as their names.
func (p *preparedNames) learn(ctx context.Context, conn *pgx.Conn) {
	defer p.pending.Store(false)
	res, err := conn.PgConn().Exec(ctx, preparedSQL).ReadAll()
	if err != nil {
		p.log.Warn("pgtraffic: reading the statements AfterConnect prepared failed; statements run by their names are decided as the names",
			"error", err)
		return
	}
	var stmts []preparedStmt
	for _, r := range res {
		for _, row := range r.Rows {
			stmts = append(stmts, preparedStmt{name: string(row[0]), text: string(row[1])})
		}
	}
	p.record(stmts...)
}
