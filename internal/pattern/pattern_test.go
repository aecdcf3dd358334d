package pattern

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/pgtraffic/pgtraffic/internal/bounded"
	"github.com/pgtraffic/pgtraffic/internal/guard"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

func TestAnalyzeKinds(t *testing.T) {
	tests := []struct {
		sql, kind, op string
		explainable   bool
	}{
		{"SELECT 1", vocab.KindSelect, "SELECT", true},
		{"VALUES (1), (2)", vocab.KindSelect, "SELECT", true},
		{"TABLE users", vocab.KindSelect, "SELECT", true},
		{"WITH x AS (SELECT 1) SELECT * FROM x", vocab.KindSelect, "SELECT", true},
		{"SELECT 1 UNION ALL SELECT 2", vocab.KindSelect, "SELECT", true},
		{"SELECT * FROM t FOR UPDATE", vocab.KindSelect, "SELECT", true},
		{"WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", vocab.KindSelect, "SELECT", true},
		{"SELECT * INTO t2 FROM t", vocab.KindDDL, "SELECT", false},
		{"INSERT INTO t VALUES (1)", vocab.KindInsert, "INSERT", true},
		{"UPDATE t SET a = 1 WHERE id = 1", vocab.KindUpdate, "UPDATE", true},
		{"DELETE FROM t WHERE id = 1", vocab.KindDelete, "DELETE", true},
		{"MERGE INTO t USING s ON t.id = s.id WHEN MATCHED THEN DELETE", vocab.KindMerge, "MERGE", true},
		{"CREATE TABLE t (a int)", vocab.KindDDL, "CREATE TABLE", false},
		{"CREATE TABLE t2 AS SELECT * FROM t", vocab.KindDDL, "CREATE TABLE AS", false},
		{"CREATE INDEX i ON t (a)", vocab.KindDDL, "CREATE INDEX", false},
		{"ALTER TABLE t ADD COLUMN b int", vocab.KindDDL, "ALTER TABLE", false},
		{"ALTER TABLE t RENAME COLUMN a TO b", vocab.KindDDL, "ALTER TABLE", false},
		{"DROP TABLE t", vocab.KindDDL, "DROP TABLE", false},
		{"DROP MATERIALIZED VIEW mv", vocab.KindDDL, "DROP MATERIALIZED VIEW", false},
		{"TRUNCATE t", vocab.KindDDL, "TRUNCATE TABLE", false},
		{"COMMENT ON TABLE t IS 'x'", vocab.KindDDL, "COMMENT", false},
		{"GRANT SELECT ON t TO bob", vocab.KindDDL, "GRANT", false},
		{"REVOKE SELECT ON t FROM bob", vocab.KindDDL, "REVOKE", false},
		{"CREATE EXTENSION pg_trgm", vocab.KindDDL, "CREATE EXTENSION", false},
		{"CREATE FUNCTION f() RETURNS int AS 'select 1' LANGUAGE sql", vocab.KindDDL, "CREATE FUNCTION", false},
		{"BEGIN", vocab.KindUtility, "BEGIN", false},
		{"COMMIT", vocab.KindUtility, "COMMIT", false},
		{"ROLLBACK", vocab.KindUtility, "ROLLBACK", false},
		{"SET search_path = public", vocab.KindUtility, "SET", false},
		{"RESET ALL", vocab.KindUtility, "RESET", false},
		{"SHOW work_mem", vocab.KindUtility, "SHOW", false},
		{"VACUUM t", vocab.KindUtility, "VACUUM", false},
		{"ANALYZE t", vocab.KindUtility, "ANALYZE", false},
		{"EXPLAIN SELECT 1", vocab.KindUtility, "EXPLAIN", false},
		{"COPY t TO STDOUT", vocab.KindCopy, "COPY", false},
		{`COPY "public"."items" FROM STDIN`, vocab.KindCopy, "COPY", false},
		{"LISTEN ch", vocab.KindUtility, "LISTEN", false},
		{"NOTIFY ch", vocab.KindUtility, "NOTIFY", false},
		{"LOCK TABLE t", vocab.KindUtility, "LOCK TABLE", false},
		{"CALL p()", vocab.KindUtility, "CALL", false},
		{"ALTER SYSTEM SET work_mem = '1MB'", vocab.KindUtility, "ALTER SYSTEM", false},
		{"", vocab.KindOther, "", false},
		{"-- just a comment", vocab.KindOther, "", false},
		{"SELEC 1", vocab.KindOther, "", false},
		{"SELECT 1; DELETE FROM t", vocab.KindSelect, "SELECT", false},
	}
	for _, tc := range tests {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.Kind != tc.kind || p.Operation != tc.op || p.Explainable != tc.explainable {
				t.Errorf("Analyze(%q): kind %q op %q explainable %v, want %q %q %v",
					tc.sql, p.Kind, p.Operation, p.Explainable, tc.kind, tc.op, tc.explainable)
			}
		})
	}
}

func TestAnalyzeTablesAndSummary(t *testing.T) {
	tests := []struct {
		sql     string
		tables  []string
		summary string
	}{
		{"SELECT * FROM orders WHERE id = $1", []string{"orders"}, "SELECT orders"},
		{"SELECT 1", []string{}, "SELECT"},
		{"SELECT * FROM a JOIN b ON a.id = b.id LEFT JOIN public.c USING (id)",
			[]string{"a", "b", "public.c"}, "SELECT a b public.c"},
		{"SELECT * FROM a WHERE id IN (SELECT a_id FROM b)", []string{"a", "b"}, "SELECT a SELECT b"},
		{"SELECT * FROM (SELECT * FROM inner_t) s", []string{"inner_t"}, "SELECT inner_t"},
		{"SELECT * FROM a, a", []string{"a"}, "SELECT a"},
		{"INSERT INTO shipping_details (id) SELECT id FROM orders",
			[]string{"orders", "shipping_details"}, "INSERT shipping_details SELECT orders"},
		{"INSERT INTO s.t VALUES (1)", []string{"s.t"}, "INSERT s.t"},
		{"UPDATE t SET a = u.a FROM u WHERE t.id = u.id", []string{"t", "u"}, "UPDATE t u"},
		{"DELETE FROM t USING u WHERE t.id = u.id", []string{"t", "u"}, "DELETE t u"},
		{"WITH x AS (SELECT * FROM o) SELECT * FROM x JOIN p ON true",
			[]string{"o", "p"}, "SELECT o SELECT p"},
		{"WITH x AS (SELECT 1), y AS (SELECT * FROM x) SELECT * FROM y", []string{}, "SELECT"},
		{"WITH t AS (SELECT * FROM t) SELECT * FROM t", []string{"t"}, "SELECT t"},
		{"WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT * FROM r",
			[]string{}, "SELECT"},
		{"WITH x AS (SELECT 1) UPDATE x SET a = 1 WHERE id = 1", []string{"x"}, "UPDATE x"},
		{"WITH d AS (DELETE FROM t RETURNING *) INSERT INTO archive SELECT * FROM d",
			[]string{"archive", "t"}, "DELETE t INSERT archive"},
		{`SELECT * FROM "Mixed"."Case"`, []string{"Mixed.Case"}, "SELECT Mixed.Case"},
		{"TRUNCATE a, b", []string{"a", "b"}, "TRUNCATE TABLE a b"},
		{"DROP TABLE a, s.b", []string{"a", "s.b"}, "DROP TABLE a s.b"},
		{"CREATE TABLE t2 AS SELECT * FROM t", []string{"t", "t2"}, "CREATE TABLE AS t2 SELECT t"},
		{"EXPLAIN SELECT * FROM t", []string{"t"}, "EXPLAIN SELECT t"},
		{"BEGIN", []string{}, "BEGIN"},
		{"SELECT * FROM a; DELETE FROM b WHERE id = 1", []string{"a", "b"}, "SELECT a DELETE b"},
		{"SELEC 1", []string{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if !slices.Equal(p.Tables, tc.tables) || p.Summary != tc.summary {
				t.Errorf("Analyze(%q): tables %q summary %q, want %q %q",
					tc.sql, p.Tables, p.Summary, tc.tables, tc.summary)
			}
		})
	}
}

func TestSummaryBounded(t *testing.T) {
	var b strings.Builder
	b.WriteString("SELECT * FROM t0")
	for i := 1; i < 200; i++ {
		b.WriteString(" JOIN a_rather_long_table_name_" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + " ON true")
	}
	p := Analyze(b.String())
	if !p.Parsed || len(p.Summary) > maxSummary || !strings.HasPrefix(p.Summary, "SELECT t0 ") {
		t.Fatalf("summary of %d bytes: %q", len(p.Summary), p.Summary)
	}
}

func TestNormalized(t *testing.T) {
	tests := []struct{ sql, want string }{
		{"SELECT * FROM t WHERE name = 'secret-123' AND n = 42", "SELECT * FROM t WHERE name = $1 AND n = $2"},
		{"SELECT * FROM t WHERE a = $1 AND b = 'x'", "SELECT * FROM t WHERE a = $1 AND b = $2"},
		{"/* tp='1' */ SELECT 1 /* mid */ FROM t -- tail\n WHERE a = 'q' /* z */;", "SELECT $1 FROM t WHERE a = $2"},
		{"SELECT 'a'::varchar(10), 1.5::numeric(10,2)", "SELECT $1::varchar(10), $2::numeric(10,2)"},
		{"SELECT E'a\\'b', U&'x', B'01', X'ff', $$d$$, $t$q$t$, -3", "SELECT $1, $2, $3, $4, $5, $6, $7"},
		{"CREATE TABLE t (a text DEFAULT 'secret-123', b numeric(10,2) DEFAULT 4111111111111111)",
			"CREATE TABLE t (a text DEFAULT $1, b numeric(10,2) DEFAULT $2)"},
		{"COMMENT ON TABLE t IS 'secret-123'", "COMMENT ON TABLE t IS $1"},
		{"COPY t FROM '/secret-123/file'", "COPY t FROM $1"},
		{"CALL charge(4111111111111111, 'secret-123')", "CALL charge($1, $2)"},
		{"ALTER ROLE bob PASSWORD 'secret-123'", "ALTER ROLE bob PASSWORD $1"},
		{"SELECT 1; SELECT 'secret-123'", "SELECT $1; SELECT $2"},
		{"SELEC 'secret-123'", ""},
	}
	for _, tc := range tests {
		t.Run(tc.sql, func(t *testing.T) {
			p := Analyze(tc.sql)
			if p.Normalized != tc.want {
				t.Errorf("Normalized = %q, want %q", p.Normalized, tc.want)
			}
			if strings.Contains(p.Normalized, "secret-123") {
				t.Errorf("Normalized %q contains the literal", p.Normalized)
			}
		})
	}
}

// bulkInsert is an INSERT of rows rows of inline literals, as a bulk loader builds it: its
// normalised text is about 25 bytes a row.
func bulkInsert(rows int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO items (id, name, note) VALUES ")
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "(%d, 'name %d', 'note é')", i, i)
	}
	return b.String()
}

// checkCut checks that got is full cut to bounded.QueryLen: valid UTF-8, at most the bound and
// not much less, full's beginning as it was, then a marker saying how many bytes were cut.
func checkCut(t *testing.T, got, full string) {
	t.Helper()
	if len(got) > bounded.QueryLen || len(got) < bounded.QueryLen-64 || !utf8.ValidString(got) {
		t.Fatalf("Normalized of %d bytes (valid UTF-8: %v), want at most %d, cut from %d",
			len(got), utf8.ValidString(got), bounded.QueryLen, len(full))
	}
	kept, marker, ok := strings.Cut(got, "…")
	if !ok || !strings.HasPrefix(full, kept) {
		t.Fatalf("Normalized does not begin as the whole text: %.80q … %.80q", got, got[max(0, len(got)-80):])
	}
	if want := fmt.Sprintf(" (%d bytes cut)", len(full)-len(kept)); marker != want {
		t.Fatalf("Normalized ends with %q, want %q", marker, want)
	}
}

// A statement's normalised text is cut to bounded.QueryLen once, when its pattern is analysed,
// so that no span, log line or status entry carries a bulk INSERT's hundreds of KiB: valid
// UTF-8 (never cut inside a character), the statement's beginning as it was, and a marker
// saying how much was cut. A text within the bound is kept whole (TestNormalized).
func TestNormalizedBounded(t *testing.T) {
	sql := bulkInsert(10_000)
	full, _ := normalize(Key(sql), true)
	if len(full) < 50*bounded.QueryLen {
		t.Fatalf("the whole normalised text has %d bytes: too short to test the bound", len(full))
	}
	p := Analyze(sql)
	if !p.Parsed || p.Kind != vocab.KindInsert || !slices.Equal(p.Tables, []string{"items"}) {
		t.Fatalf("bulk INSERT: parsed %v, kind %q, tables %q", p.Parsed, p.Kind, p.Tables)
	}
	checkCut(t, p.Normalized, full)
	if head := "INSERT INTO items (id, name, note) VALUES ($1, $2, $3), ($4, $5, $6), "; !strings.HasPrefix(p.Normalized, head) {
		t.Errorf("Normalized begins %.80q, want %q", p.Normalized, head)
	}
	if strings.Contains(p.Normalized, "name 1") {
		t.Errorf("Normalized holds a literal: %.200q", p.Normalized)
	}

	// Three-byte characters everywhere, at three offsets: one of them puts the bound inside one.
	for pad := range 3 {
		sql := "SELECT " + strings.Repeat("x", pad) + "1, " + strings.Repeat(`"日本語" || 'v', `, 2000) + "2 FROM t"
		full, _ := normalize(Key(sql), true)
		checkCut(t, Analyze(sql).Normalized, full)
	}
}

var hex16RE = regexp.MustCompile(`^[0-9a-f]{16}$`)

func TestAnalyzeEdges(t *testing.T) {
	t.Run("empty", func(t *testing.T) {
		for _, sql := range []string{"", "  ;  ", "/* c */"} {
			p := Analyze(sql)
			if !p.Parsed || p.Statements != 0 || p.Kind != vocab.KindOther || p.Explainable ||
				p.UnsafeWrite || !hex16RE.MatchString(p.Fingerprint) || p.Normalized != "" {
				t.Errorf("Analyze(%q) = %+v", sql, p)
			}
		}
	})
	t.Run("unparsable", func(t *testing.T) {
		p := Analyze("SELEC 'secret-123' FROM")
		q := Analyze("/* other comment */ SELEC 'secret-123' FROM;")
		r := Analyze("SELEC 'secret-124' FROM")
		w := Analyze("SELEC 'secret-123' INTO")
		if p.Parsed || p.Kind != vocab.KindOther || p.Normalized != "" || p.Statements != 0 || p.Explainable ||
			!hex16RE.MatchString(p.Fingerprint) || vocab.FingerprintHex(p.FingerprintID) != p.Fingerprint {
			t.Errorf("unparsable: %+v", p)
		}
		if p.Fingerprint != q.Fingerprint {
			t.Errorf("comments changed the hash fingerprint: %s vs %s", p.Fingerprint, q.Fingerprint)
		}
		if p.Fingerprint != r.Fingerprint {
			t.Errorf("another literal, another fingerprint (one pattern per value): %s vs %s", p.Fingerprint, r.Fingerprint)
		}
		if p.Fingerprint == w.Fingerprint {
			t.Errorf("texts of other words share fingerprint %s", p.Fingerprint)
		}
	})
	t.Run("fingerprint", func(t *testing.T) {
		a := Analyze("SELECT * FROM t WHERE id = 1")
		b := Analyze("select *  from t where id = 2 /* c */")
		c := Analyze("SELECT * FROM u WHERE id = 1")
		if a.Fingerprint != b.Fingerprint || a.FingerprintID != b.FingerprintID || a.Fingerprint == c.Fingerprint {
			t.Errorf("fingerprints a=%s b=%s c=%s", a.Fingerprint, b.Fingerprint, c.Fingerprint)
		}
		if !hex16RE.MatchString(a.Fingerprint) || vocab.FingerprintHex(a.FingerprintID) != a.Fingerprint {
			t.Errorf("fingerprint %q id %x", a.Fingerprint, a.FingerprintID)
		}
	})
	t.Run("multi-statement", func(t *testing.T) {
		p := Analyze("SELECT 1; UPDATE t SET a = 1; TRUNCATE u;")
		if p.Statements != 3 || p.Kind != vocab.KindSelect || p.Explainable || !p.UnsafeWrite || !p.Truncate ||
			!slices.Equal(p.Tables, []string{"t", "u"}) {
			t.Errorf("multi-statement: %+v", p)
		}
	})
	t.Run("1MiB literal", func(t *testing.T) {
		big := "SELECT * FROM t WHERE payload = '" + strings.Repeat("secret-123 ", 1<<20/11) + "'"
		p := Analyze(big)
		if !p.Parsed || p.Normalized != "SELECT * FROM t WHERE payload = $1" || p.Kind != vocab.KindSelect ||
			!slices.Equal(p.Tables, []string{"t"}) {
			t.Errorf("1 MiB literal: parsed %v kind %q normalized %.80q", p.Parsed, p.Kind, p.Normalized)
		}
	})
}

// The pattern's texts are valid UTF-8, which telemetry relies on: a text with bytes that are not
// is left unparsed by pg_query (so it has no texts), and an identifier past PostgreSQL's 63 bytes
// is cut at a character's start.
func TestPatternTextIsUTF8(t *testing.T) {
	for _, sql := range []string{
		"SELECT \"caf\xff\" FROM \"t\xfe\"",
		"SELECT 'v\xff' FROM t",
		"SELECT 1 FROM \"" + strings.Repeat("é", 40) + "\"",
		"SELECT \"café\" FROM s.\"ümlaut\"",
	} {
		p := Analyze(sql)
		if !validText(p) {
			t.Errorf("Analyze(%q): text that is not UTF-8: %+v", sql, p)
		}
		if utf8.ValidString(sql) != p.Parsed {
			t.Errorf("Analyze(%q): parsed %v", sql, p.Parsed)
		}
	}
	if p := Analyze("SELECT 1 FROM \"" + strings.Repeat("é", 40) + "\""); len(p.Tables) != 1 || len(p.Tables[0]) != 62 {
		t.Errorf("an 80-byte identifier: tables %q, want one of 62 bytes", p.Tables)
	}
}

// validText reports whether p's texts are valid UTF-8.
func validText(p *Pattern) bool {
	for _, s := range append([]string{p.Normalized, p.Summary, p.Operation}, p.Tables...) {
		if !utf8.ValidString(s) {
			return false
		}
	}
	return true
}

// FuzzAnalyze checks that no input panics and that the invariants hold.
func FuzzAnalyze(f *testing.F) {
	for _, tc := range append(guardCases, backslashCases...) {
		f.Add(tc.sql)
	}
	f.Add("SELECT * FROM t WHERE a = 'secret-123' /* c */")
	f.Add("INSERT INTO t VALUES (E'x\\'y', $$z$$, B'1')")
	f.Add("CREATE TABLE t (a varchar(10) DEFAULT 'q')")
	f.Add("SELECT \"caf\xff\" FROM \"t\xfe\"")
	f.Add("SELECT 1" + strings.Repeat(" UNION ALL SELECT 1", 2*maxNesting)) // unparsable: too deep
	f.Fuzz(func(t *testing.T, sql string) {
		p := Analyze(sql)
		if !validText(p) {
			t.Fatalf("Analyze(%q): text that is not UTF-8: %+v", sql, p)
		}
		if !hex16RE.MatchString(p.Fingerprint) || vocab.FingerprintHex(p.FingerprintID) != p.Fingerprint {
			t.Fatalf("bad fingerprint %q / %x", p.Fingerprint, p.FingerprintID)
		}
		if !p.Parsed {
			if p.Normalized != "" || p.Kind != vocab.KindOther || p.Facts != guard.Unparsed(Key(sql)) {
				t.Fatalf("unparsable text with facts: %+v", p)
			}
		}
		if p.Explainable && p.Statements != 1 {
			t.Fatalf("explainable with %d statements", p.Statements)
		}
		if len(p.Summary) > maxSummary || len(p.Normalized) > bounded.QueryLen || !slices.IsSorted(p.Tables) {
			t.Fatalf("summary %q, normalised text of %d bytes, tables %q", p.Summary, len(p.Normalized), p.Tables)
		}
		// No quoted literal of the input survives normalisation as a literal (its text may
		// still be part of an identifier: A$$z$$ is one).
		if p.Normalized != "" {
			left := scanLiterals(p.Normalized)
			for _, lit := range scanLiterals(sql) {
				if len(lit) > 3 && slices.Contains(left, lit) {
					t.Fatalf("Normalized %q contains literal %q of %q", p.Normalized, lit, sql)
				}
			}
		}
	})
}

// scanLiterals returns the quoted literal tokens of sql as pg_query's scanner
// sees them.
func scanLiterals(sql string) []string {
	res, err := pgScan(sql)
	if err != nil {
		return nil
	}
	return res
}

// TestUnparsableFingerprint: a text pg_query cannot parse (here PostgreSQL 17's MERGE … WHEN
// NOT MATCHED BY SOURCE) is one pattern whatever its literals, and its fingerprint, which
// errors, logs, spans and the status page show, cannot be matched against guesses at a
// literal by hashing the text: it holds nothing of them. Its other words still tell patterns
// apart. A text the scanner rejects too is one pattern per text.
func TestUnparsableFingerprint(t *testing.T) {
	const shape = "merge into accounts a using users u on a.uid = u.id and u.email = 'alice@example.com' and u.pin = %04d when not matched by source then delete"
	p := Analyze(fmt.Sprintf(shape, 4821))
	if p.Parsed || p.Normalized != "" {
		t.Fatalf("the text parsed (%+v): the test needs one pg_query rejects", p)
	}
	if q := Analyze(fmt.Sprintf(shape, 1111)); q.Fingerprint != p.Fingerprint {
		t.Errorf("another PIN, another pattern: %s vs %s", q.Fingerprint, p.Fingerprint)
	}
	if q := Analyze(strings.Replace(fmt.Sprintf(shape, 4821), "'alice@example.com'", "'bob@example.com' /* x */", 1)); q.Fingerprint != p.Fingerprint {
		t.Errorf("another string literal or a comment, another pattern: %s vs %s", q.Fingerprint, p.Fingerprint)
	}
	if q := Analyze(strings.Replace(fmt.Sprintf(shape, 4821), "u.pin", "u.code", 1)); q.Fingerprint == p.Fingerprint {
		t.Error("another column, the same pattern")
	}
	for pin := range 10000 {
		h := fnv.New64a()
		h.Write([]byte(fmt.Sprintf(shape, pin)))
		if vocab.FingerprintHex(h.Sum64()) == p.Fingerprint {
			t.Fatalf("the fingerprint is the hash of the text with PIN %04d: a literal can be recovered from it", pin)
		}
	}
	u := Analyze("select 'unterminated")
	if v := Analyze("select 'unterminated"); v.Fingerprint != u.Fingerprint {
		t.Errorf("a text the scanner rejects: two fingerprints %s and %s", u.Fingerprint, v.Fingerprint)
	}
	h := fnv.New64a()
	h.Write([]byte("select 'unterminated"))
	if vocab.FingerprintHex(h.Sum64()) == u.Fingerprint {
		t.Error("a text the scanner rejects is fingerprinted by an unkeyed hash of its text")
	}
}

// TestTextOfTheSettingHoldsNoLiteral: 'a\' , secret , ' is one string to a server with
// standard_conforming_strings off and a string, a name and a string to pg_query: the pattern
// shows no normalised text and its fingerprint does not depend on the word.
func TestTextOfTheSettingHoldsNoLiteral(t *testing.T) {
	a := Analyze(`select 'a\' , S3CRETOFF , ' , 1 as z -- '`)
	b := Analyze(`select 'a\' , OTHERWORD , ' , 1 as z -- '`)
	if strings.Contains(a.Normalized, "S3CRETOFF") || a.Normalized != "" {
		t.Errorf("normalised text %q", a.Normalized)
	}
	if a.Fingerprint != b.Fingerprint {
		t.Errorf("fingerprints %s and %s: the word of a string is hashed", a.Fingerprint, b.Fingerprint)
	}
	if c := Analyze(`select 'a' , S3CRETOFF , 'b'`); c.Normalized == "" || c.Fingerprint == a.Fingerprint {
		t.Errorf("a text the setting does not change: %+v", c)
	}
}
