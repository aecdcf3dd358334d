package driver

import (
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/pattern"
)

// TestSecretFingerprintHoldsLiterals: the fingerprint is exported everywhere (span attribute
// pgtraffic.fingerprint, the fingerprint tag, decision logs, BlockedError.Error(), the status
// page). Like the normalised text, it must hold nothing of a statement's literals: two
// statements that differ only in a literal must share it (package pattern does this for text
// pg_query cannot parse, unparsableID, for exactly this reason: a fingerprint that depends on a
// literal lets whoever sees it recover a short secret by trying each value).
func TestSecretFingerprintHoldsLiterals(t *testing.T) {
	for _, shape := range []string{
		`alter role bob password '%s'`,
		`select 1; alter role bob password '%s'`,
		`create role bob login password '%s'`,
		`create user mapping for bob server s options (user 'bob', password '%s')`,
		`comment on table users is '%s'`,
		`copy users from '/tmp/%s.csv'`,
		`notify chan, '%s'`,
		`security label on table users is '%s'`,
		`create subscription sub connection 'host=h user=u password=%s' publication p`,
		`alter subscription sub connection 'host=h user=u password=%s'`,
		`create server s foreign data wrapper postgres_fdw options (host 'h', password '%s')`,
		`create function f() returns text language sql as 'select ''%s'''`,
		`select * from users where pw = '%s' collate "C"`,
		`create table t (c text default '%s')`,
		`set app.key = '%s'`,
	} {
		a := pattern.Analyze(strings.ReplaceAll(shape, "%s", "S3CRET-aaaa"))
		b := pattern.Analyze(strings.ReplaceAll(shape, "%s", "S3CRET-bbbb"))
		if a.Normalized != b.Normalized {
			t.Fatalf("%s: normalised texts differ: %q, %q", shape, a.Normalized, b.Normalized)
		}
		if a.Fingerprint != b.Fingerprint {
			t.Errorf("%s: the fingerprint depends on the literal (%s vs %s) although the normalised text %q does not",
				shape, a.Fingerprint, b.Fingerprint, a.Normalized)
		}
	}
}
