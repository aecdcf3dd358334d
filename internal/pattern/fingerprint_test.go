package pattern

import (
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// TestFingerprintIgnoresLiteralsBesidePositionalOrderBy: a pattern's fingerprint is
// "stable over literals": design.md has pg_query give each statement its fingerprint and
// normalised text (literals → $n), and this package's token fingerprint (unparsableID) exists
// so that one statement shape is one pattern whatever its values: its learned cost,
// quarantine strikes and refusals count together, and a `match: {fingerprint: …}` rule copied
// from the status page catches every execution of the query. A user expects a report that
// differs only in a literal's value (a negative threshold, a decimal one) to be one pattern,
// as it is without the ORDER BY 1 or GROUP BY 1 that reports commonly end with. With the
// positional reference, pg_query leaves that "1" in its normalised text, where the sign of a
// number (a separate "-" token), its integer-or-decimal spelling, a string in its place or a
// parameter ($n, as pg_stat_statements shows the text) must not make a new pattern either:
// the normalised texts are identical.
func TestFingerprintIgnoresLiteralsBesidePositionalOrderBy(t *testing.T) {
	for _, texts := range [][]string{
		{
			"SELECT account_id, count(*) FROM events WHERE delta > 10 GROUP BY 1",
			"SELECT account_id, count(*) FROM events WHERE delta > -10 GROUP BY 1",
			"SELECT account_id, count(*) FROM events WHERE delta > 10.5 GROUP BY 1",
		},
		{
			// A report as sent, literals inline, and as pg_stat_statements or pg_stat_activity
			// shows it: a rule copied from either must catch the other (driver.Fingerprint).
			"SELECT date_trunc('day', created), sum(amount) FROM orders WHERE created > '2020-01-01' GROUP BY 1 ORDER BY 1",
			"SELECT date_trunc($1, created), sum(amount) FROM orders WHERE created > $2 GROUP BY 1 ORDER BY 1",
			"SELECT date_trunc(E'day', created), sum(amount) FROM orders WHERE created > 20200101 GROUP BY 1 ORDER BY 1",
		},
		{
			"SELECT * FROM events WHERE delta > 10 ORDER BY 1 DESC",
			"SELECT * FROM events WHERE delta > -10 ORDER BY 1 DESC",
			"SELECT * FROM events WHERE delta > 0.5 ORDER BY 1 DESC",
		},
	} {
		first := Analyze(texts[0])
		for _, s := range texts[1:] {
			p := Analyze(s)
			if p.Normalized != first.Normalized {
				t.Fatalf("normalised texts differ (%q vs %q): the test needs one shape", p.Normalized, first.Normalized)
			}
			if p.Fingerprint != first.Fingerprint {
				t.Errorf("%q: fingerprint %s, but %q (same normalised text %q) has %s: one shape, two patterns",
					s, p.Fingerprint, texts[0], p.Normalized, first.Fingerprint)
			}
		}
	}
}

// TestTokenFingerprintNumbers: wherever the fingerprint is the hash of the tokens (a statement
// other than DML, a text pg_query cannot parse), a number is one value whatever its sign and
// spelling, and so is a string or a parameter in its place, and the normalised text agrees; a
// minus that subtracts is still an operator.
func TestTokenFingerprintNumbers(t *testing.T) {
	for _, tc := range []struct {
		name string
		same []string // one pattern, one normalised text
		diff string   // another pattern
	}{
		{"call", []string{"CALL p(1, x)", "CALL p(-1, x)", "CALL p(1.5, x)", "CALL p(- 2e3, x)"}, "CALL p(+1, x)"},
		{"set", []string{"SET statement_timeout = 1000", "SET statement_timeout = -1"}, "SET lock_timeout = 1"},
		{"sequence", []string{"ALTER SEQUENCE s INCREMENT BY 1", "ALTER SEQUENCE s INCREMENT BY -1"}, "ALTER SEQUENCE s RESTART WITH 1"},
		{"default", []string{"CREATE TABLE t (a numeric(10,2) DEFAULT 0.5)", "CREATE TABLE t (a numeric(10,2) DEFAULT -3)", "CREATE TABLE t (a numeric(10,2) DEFAULT '3')"}, "CREATE TABLE t (a numeric(10,2) DEFAULT 3 NOT NULL)"},
		{"strings and parameters", []string{"CALL p('a', x)", "CALL p($1, x)", "CALL p(E'a\\'', x)", "CALL p($$a$$, x)", "CALL p(B'1', x)", "CALL p(X'1f', x)"}, "CALL p('a', 'x')"},
		{"subtraction", []string{"CALL p(x - 1)", "CALL p(x - -1.5)", "CALL p(x /* c */ - 2)"}, "CALL p(x + 1)"},
		{"after brackets", []string{"CALL p(f(x) - 1, a[1] - 1)", "CALL p(f(x) - -1, a[-2] - 3.5)"}, "CALL p(f(x) + 1, a[1] - 1)"},
		{"unparsable", []string{"SELEC x FROM t WHERE y > 10", "SELEC x FROM t WHERE y > -10.5"}, "SELEC x FROM t WHERE y - 10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first := Analyze(tc.same[0])
			if first.Parsed && first.Kind != vocab.KindOther && first.Kind != vocab.KindDDL && first.Kind != vocab.KindUtility {
				t.Fatalf("%q is of kind %s: the test needs a text fingerprinted by its tokens", tc.same[0], first.Kind)
			}
			for _, s := range tc.same[1:] {
				p := Analyze(s)
				if p.Fingerprint != first.Fingerprint || p.Normalized != first.Normalized {
					t.Errorf("%q: fingerprint %s, normalised %q; %q: %s, %q", s, p.Fingerprint, p.Normalized,
						tc.same[0], first.Fingerprint, first.Normalized)
				}
			}
			if p := Analyze(tc.diff); p.Fingerprint == first.Fingerprint {
				t.Errorf("%q and %q share fingerprint %s", tc.diff, tc.same[0], p.Fingerprint)
			}
		})
	}
}

// TestFingerprintStable pins fingerprints: they name patterns in rules (`match: {fingerprint:
// …}`), dashboards and the status page: a failure here means that fingerprints users have
// written down changed, which must be deliberate and said in the changelog.
func TestFingerprintStable(t *testing.T) {
	for sql, want := range map[string]string{
		"SELECT * FROM t WHERE x = 1":              "523e1fe3a3cb6111", // pg_query's
		"SELECT * FROM t WHERE x = $1 ORDER BY 1":  "d58ddf757f949f93", // one pattern with its literal forms
		"SELECT * FROM t WHERE x = 1 ORDER BY 1":   "d58ddf757f949f93", // (pg_query's since positions no
		"SELECT * FROM t WHERE x = '1' ORDER BY 1": "d58ddf757f949f93", // longer send a text to the
		"SELECT * FROM t WHERE x = -1 ORDER BY 1":  "d58ddf757f949f93", // token fingerprint)
		"CALL p(1)":    "b8099ca1ab51603c",
		"CALL p('a')":  "b8099ca1ab51603c",
		"SET x = 1000": "95f27fefc9287677",
	} {
		if got := Analyze(sql).Fingerprint; got != want {
			t.Errorf("%q: fingerprint %s, want %s", sql, got, want)
		}
	}
}

// TestFingerprintValueListsBesidePositionalOrderBy: a report grouped or ordered by position is
// one pattern however many values its IN list or array holds and whichever boolean it
// compares with, as it is grouped by name: generated SQL varies the length of a list with its
// input, and a pattern per length would escape a block by fingerprint (the incident
// runbook), a per_query_limit refusal and the cost it learned, each new length a cold start.
// As in pg_query's fingerprint, the positions are not told apart (GROUP BY 1 and GROUP BY 2
// are one pattern, as a value is), but a positional ORDER BY is part of the shape.
func TestFingerprintValueListsBesidePositionalOrderBy(t *testing.T) {
	in := func(n int) string {
		s := "SELECT region, count(*) FROM orders WHERE region IN (1"
		for i := 2; i <= n; i++ {
			s += ", " + string(rune('0'+i%10))
		}
		return s + ") GROUP BY 1"
	}
	for _, texts := range [][]string{
		{in(1), in(2), in(3), in(12), "SELECT region, count(*) FROM orders WHERE region IN ($1, $2) GROUP BY 1"},
		{
			"SELECT a FROM t WHERE archived = true GROUP BY 1",
			"SELECT a FROM t WHERE archived = false GROUP BY 1",
			"SELECT a FROM t WHERE archived = $1 GROUP BY 1",
		},
		{
			"SELECT a, b FROM t WHERE x = ANY(ARRAY[1, 2, 3]) ORDER BY 2",
			"SELECT a, b FROM t WHERE x = ANY(ARRAY[1]) ORDER BY 2",
		},
	} {
		onePattern(t, texts)
	}
	for _, pair := range [][2]string{
		{"SELECT a, b FROM t ORDER BY 1", "SELECT a, b FROM t"},
		{"SELECT a, count(*) FROM t GROUP BY 1", "SELECT a, count(*) FROM t GROUP BY a"},
	} {
		if a, b := Analyze(pair[0]), Analyze(pair[1]); a.Fingerprint == b.Fingerprint {
			t.Errorf("%q and %q share fingerprint %s: positions are the statement's shape", pair[0], pair[1], a.Fingerprint)
		}
	}
}

// TestSettingValuesHidden: a setting's value written as a bare word or a quoted identifier,
// which PostgreSQL reads as a string constant, is a value: neither the normalised text (which
// spans and the status page show) nor the fingerprint holds it, so nobody recovers a short
// secret from either by trying values. The setting's name stays.
func TestSettingValuesHidden(t *testing.T) {
	for _, texts := range [][2]string{
		{"set app.api_key = S3CRETkey1", "set app.api_key = S3CRETkey2"},
		{"SET app.api_key TO S3CRETkey1", "SET app.api_key TO 'S3CRETkey2'"},
		{"alter role current_user set app.k = S3CRETx", "alter role current_user set app.k = S3CRETy"},
		{`alter database d set app.k = "S3CRETq"`, `alter database d set app.k = "S3CRETr"`},
		{"alter system set app.k = S3CRETs", "alter system set app.k = S3CRETt"},
		{"set search_path = tenant_1, public", "set search_path = tenant_2, public"},
	} {
		a, b := Analyze(texts[0]), Analyze(texts[1])
		if a.Fingerprint != b.Fingerprint {
			t.Errorf("%q and %q: fingerprints %s and %s: the value is in the fingerprint", texts[0], texts[1], a.Fingerprint, b.Fingerprint)
		}
		if strings.Contains(a.Normalized, "S3CRET") || strings.Contains(a.Normalized, "tenant_1") {
			t.Errorf("%q: normalised %q holds the value", texts[0], a.Normalized)
		}
	}
	if a, b := Analyze("set app.a = x"), Analyze("set app.b = x"); a.Fingerprint == b.Fingerprint {
		t.Errorf("settings app.a and app.b share fingerprint %s: the name is the statement's shape", a.Fingerprint)
	}
	if p := Analyze("update t set a = b"); p.Normalized != "update t set a = b" {
		t.Errorf("an UPDATE's column in its SET became %q: only a setting's value is hidden", p.Normalized)
	}
}

// TestFingerprintKeepsValueClauses: pg_query's fingerprint leaves values out, and with them a
// clause that is only a value: `… where false` (an ORM's empty IN list) and the full cross join
// without it, or `… limit 10` and the unbounded scan, were one pattern, and under explain:
// pattern or auto the full scan was priced as its cheap twin and let past per_query_limit.
// Such a clause is part of the shape; its value still is not (limit 10, 500, $1: one pattern).
func TestFingerprintKeepsValueClauses(t *testing.T) {
	for _, pair := range [][2]string{
		{"select count(*) from big_a a, big_b b where false", "select count(*) from big_a a, big_b b"},
		{"select * from big limit 10", "select * from big"},
		{"select * from big offset 5", "select * from big"},
		{"select a, count(*) from big group by a having true", "select a, count(*) from big group by a"},
		{"delete from t where false", "delete from t"},
		{"update t set a = 1 where false", "update t set a = 1"},
		{"select * from big where true", "select * from big where false limit 1"},
	} {
		if a, b := Analyze(pair[0]), Analyze(pair[1]); a.Fingerprint == b.Fingerprint {
			t.Errorf("%q and %q share fingerprint %s", pair[0], pair[1], a.Fingerprint)
		}
	}
	for _, same := range [][]string{
		{"select * from big limit 10", "select * from big limit 500", "select * from big limit $1", "select * from big limit '7'::int"},
		{"select * from t where false", "select * from t where true", "select * from t where $1"},
		{"select * from t where x = 1 limit 5", "select * from t where x = $1 limit $2"},
	} {
		onePattern(t, same)
	}
}

// onePattern checks that texts share one fingerprint.
func onePattern(t *testing.T, texts []string) {
	t.Helper()
	first := Analyze(texts[0])
	for _, s := range texts[1:] {
		if p := Analyze(s); p.Fingerprint != first.Fingerprint {
			t.Errorf("%q: fingerprint %s, but %q has %s: one statement's shape, two patterns",
				s, p.Fingerprint, texts[0], first.Fingerprint)
		}
	}
}
