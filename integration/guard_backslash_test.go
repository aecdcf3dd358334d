package integration

import (
	"context"
	"errors"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
)

// TestGuardBackslashStrings: a string ending in a backslash ('C:\') is an ordinary string on a
// server with standard_conforming_strings on, PostgreSQL's default; with it off the text is
// another one, whose writes require_where judges too. Each statement below is a syntax error
// with the setting off and safe with it on, and runs; before, the guard judged such a text by
// its words and refused every one holding "update" or "delete", a SELECT and an INSERT
// included, as "UPDATE or DELETE without a WHERE". A text that is an unrestricted write with
// the setting off is still refused.
func TestGuardBackslashStrings(t *testing.T) {
	raw, db, _ := openBoth(t, driver.WithConfig(guardRules(t)))
	ctx := context.Background()
	if _, err := raw.ExecContext(ctx, `create table files (id int primary key, path text);
		insert into files select g, 'C:\dir\f' || g from generate_series(1, 5) g;
		create table notes (id serial primary key, path text, body text)`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		stmt string
		args []any
	}{
		{`UPDATE files SET path = replace(path, '\', '/') WHERE id = $1`, []any{1}},
		{`DELETE FROM files WHERE id = $1 AND path <> 'C:\'`, []any{2}},
		{`UPDATE files SET path = 'C:\' WHERE id = $1`, []any{3}},
		{`INSERT INTO notes (path, body) VALUES ('C:\', 'please delete me')`, nil},
		{`INSERT INTO notes (path, body) VALUES ('C:\', 'update available')`, nil},
		{`SELECT count(*) FROM notes WHERE path = 'C:\' AND body <> 'delete'`, nil},
	} {
		if _, err := db.ExecContext(ctx, tc.stmt, tc.args...); err != nil {
			t.Errorf("%s: %v, want run", tc.stmt, err)
		}
	}
	// With the setting off: UPDATE files SET path = '\' WHERE id = 1 --' ... , no WHERE.
	const offUnsafe = `UPDATE files SET path = '\' WHERE id = 1 --'`
	if _, err := db.ExecContext(ctx, offUnsafe); !errors.Is(err, driver.ErrBlocked) {
		t.Errorf("%s: %v, want refused (with standard_conforming_strings off it has no WHERE)", offUnsafe, err)
	}
}
