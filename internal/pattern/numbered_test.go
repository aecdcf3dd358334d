package pattern

import (
	"testing"

	pg "github.com/pganalyze/pg_query_go/v5"
)

// TestNumberedTablesApart: pg_query's fingerprint leaves runs of digits out of a table's name,
// so events_202401 and events_202402 would be one pattern; they are different relations, with
// costs of their own. Their literals still do not split a pattern, and a text of tables without
// such digits keeps pg_query's fingerprint (rules and dashboards name fingerprints).
func TestNumberedTablesApart(t *testing.T) {
	a := Analyze("select count(*) from events_202401 where id = 1")
	b := Analyze("select count(*) from events_202402 where id = 1")
	if a.Fingerprint == b.Fingerprint {
		t.Errorf("events_202401 and events_202402 share fingerprint %s", a.Fingerprint)
	}
	if c := Analyze("select count(*) from events_202401 where id = 2"); c.Fingerprint != a.Fingerprint {
		t.Errorf("a literal split events_202401's pattern: %s, %s", a.Fingerprint, c.Fingerprint)
	}
	const plain = "select count(*) from ev1 join orders on true where id = $1"
	want, err := pg.FingerprintToUInt64(plain)
	if err != nil {
		t.Fatal(err)
	}
	if got := Analyze(plain).FingerprintID; got != want {
		t.Errorf("a text of tables without two digits in a row: fingerprint %x, want pg_query's %x", got, want)
	}
}
