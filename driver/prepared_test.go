package driver

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestPreparedNames(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recorded [][]preparedStmt // one slice per record call (a connection)
		sql      string
		want     string
		warns    int
	}{
		{name: "none", sql: "purge", want: "purge"},
		{name: "a name", recorded: [][]preparedStmt{{{"purge", "delete from t"}}}, sql: "purge", want: "delete from t"},
		{name: "another text", recorded: [][]preparedStmt{{{"purge", "delete from t"}}}, sql: "select 1", want: "select 1"},
		{name: "longer than every name", recorded: [][]preparedStmt{{{"p", "delete from t"}}}, sql: "purge", want: "purge"},
		{name: "the same on two connections",
			recorded: [][]preparedStmt{{{"purge", "delete from t"}}, {{"purge", "delete from t"}}},
			sql:      "purge", want: "delete from t"},
		{name: "two texts on two connections: the name",
			recorded: [][]preparedStmt{{{"purge", "delete from t"}}, {{"purge", "delete from u"}}},
			sql:      "purge", want: "purge", warns: 1},
		{name: "two texts on one: the name", recorded: [][]preparedStmt{{{"purge", "delete from t"}, {"purge", "delete from u"}}},
			sql: "purge", want: "purge", warns: 1},
		{name: "a conflict is for good",
			recorded: [][]preparedStmt{{{"purge", "delete from t"}}, {{"purge", "delete from u"}}, {{"purge", "delete from t"}}},
			sql:      "purge", want: "purge", warns: 1},
		{name: "the others stay",
			recorded: [][]preparedStmt{{{"purge", "delete from t"}, {"list", "select * from t"}}, {{"purge", "delete from u"}}},
			sql:      "list", want: "select * from t", warns: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			p := &preparedNames{log: slog.New(slog.NewTextHandler(&logs, nil))}
			for _, stmts := range tc.recorded {
				p.record(stmts...)
			}
			if got := p.text(tc.sql); got != tc.want {
				t.Errorf("text(%q) = %q, want %q", tc.sql, got, tc.want)
			}
			if got := strings.Count(logs.String(), "level=WARN"); got != tc.warns {
				t.Errorf("%d warnings, want %d:\n%s", got, tc.warns, logs.String())
			}
			if strings.Contains(logs.String(), "delete from") {
				t.Errorf("a statement's text was logged:\n%s", logs.String())
			}
		})
	}
}

// A database/sql connection's statement has no names; a pool's reads them once they are known.
func TestPreparedNamesNil(t *testing.T) {
	var p *preparedNames
	if got := p.text("purge"); got != "purge" {
		t.Errorf("text = %q on no names", got)
	}
}

// At most maxPreparedNames names are kept; the others are decided as themselves, with one
// warning.
func TestPreparedNamesBounded(t *testing.T) {
	var logs bytes.Buffer
	p := &preparedNames{log: slog.New(slog.NewTextHandler(&logs, nil))}
	stmts := make([]preparedStmt, maxPreparedNames+10)
	for i := range stmts {
		stmts[i] = preparedStmt{fmt.Sprintf("s%d", i), fmt.Sprintf("select %d", i)}
	}
	p.record(stmts[:maxPreparedNames+5]...)
	p.record(stmts[maxPreparedNames+5:]...)
	if got := p.table.Load().len(); got != maxPreparedNames {
		t.Errorf("%d names kept, want %d", got, maxPreparedNames)
	}
	if got := p.text("s0"); got != "select 0" {
		t.Errorf("the first name: %q", got)
	}
	last := stmts[len(stmts)-1].name
	if got := p.text(last); got != last {
		t.Errorf("a name beyond the bound: %q, want the name", got)
	}
	if got := strings.Count(logs.String(), "level=WARN"); got != 1 {
		t.Errorf("%d warnings, want 1:\n%s", got, logs.String())
	}
}

// A statement of a pool that prepares nothing reads the names without allocating.
func BenchmarkPreparedNamesNone(b *testing.B) {
	p := &preparedNames{}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = p.text("select * from t where id = $1")
		}
	})
}

// A statement of a pool with names, whose text is longer than every name, is not looked up.
func BenchmarkPreparedNamesText(b *testing.B) {
	p := &preparedNames{log: slog.New(slog.DiscardHandler)}
	p.record(preparedStmt{"purge", "delete from t"}, preparedStmt{"list", "select * from t"})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			_ = p.text("select * from t where id = $1")
		}
	})
}
