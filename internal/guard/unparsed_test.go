package guard

import "testing"

// TestUnparsedUpdateAfterQuotedWord: Unparsed exempts UPDATE after FOR, KEY or DO (SELECT ...
// FOR UPDATE, ON CONFLICT DO UPDATE), but only where nothing but whitespace separates the two:
// a literal or comment ending in "key", "for" or "do" right before a real UPDATE does not hide
// it. With standard_conforming_strings off the server runs these UPDATEs on every row
// (pg_query, reading the setting on, cannot parse them or reads them as one string).
func TestUnparsedUpdateAfterQuotedWord(t *testing.T) {
	for _, sql := range []string{
		`INSERT INTO n VALUES ('it\'s the key'); UPDATE t SET a = 1`,
		`SELECT '\'' , 'do' ; UPDATE t SET a = 1; --'`,
		`SELECT '\'' ; /* for */ UPDATE t SET a = 1; --'`,
		`SELECT 'a\'b' AS "for"; UPDATE t SET a = 1`,
		// A line comment's last word, the newline after it the only space before the UPDATE.
		"select 1; -- reset the balances for\nupdate acct set bal = 0",
		"select 1; -- what we do\nupdate acct set bal = 0",
		"select 1; -- by key\r\nupdate acct set bal = 0",
		"with c as (select 1) -- for\nupdate acct set bal = 0",
	} {
		t.Run(sql, func(t *testing.T) {
			if f := Unparsed(sql); !f.UnsafeWrite {
				t.Errorf("%q: UnsafeWrite=false, want true (an unrestricted UPDATE follows a quoted or commented word)", sql)
			}
		})
	}
}

// TestUnparsedKeepsRowLocks: the exemption still holds for real row locks and upserts.
func TestUnparsedKeepsRowLocks(t *testing.T) {
	for _, sql := range []string{
		`SELECT * FROM t WHERE a = '\'' FOR UPDATE`,
		`SELECT * FROM t WHERE a = '\'' FOR NO KEY UPDATE`,
		`SELECT * FROM t WHERE a = '\'' for  update SKIP LOCKED`,
		`INSERT INTO t VALUES ('\'') ON CONFLICT (id) DO UPDATE SET a = 1`,
		"SELECT * FROM t -- the row\nFOR\nUPDATE",
	} {
		if f := Unparsed(sql); f.UnsafeWrite {
			t.Errorf("%q: UnsafeWrite=true, want false", sql)
		}
	}
}
