package driver

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestHealthDatabase: the identity the health sampler election is keyed by names the user,
// every host and port, the database, the check that picks the host (target_session_attrs) and
// the session's runtime parameters but application_name, and never the password.
func TestHealthDatabase(t *testing.T) {
	const primary = "?github.com/jackc/pgx/v5/pgconn.ValidateConnectTargetSessionAttrsPrimary"
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://app:s3cret@db1:5433/orders", "app@db1:5433/orders"},
		{"postgres://app:s3cret@db1:5433,db2:5434/orders", "app@db1:5433,db2:5434/orders"},
		{"host=/run/postgresql user=app password=s3cret dbname=orders", "app@/run/postgresql:5432/orders"},
		{"postgres://app:s3cret@db1,db2/orders?target_session_attrs=primary", "app@db1:5432,db2:5432/orders" + primary},
		{"postgres://app:s3cret@db1/orders?search_path=tenant_a&application_name=web",
			"app@db1:5432/orders;search_path=tenant_a"},
	} {
		cc, err := pgx.ParseConfig(tc.dsn)
		if err != nil {
			t.Fatal(err)
		}
		got := healthDatabase(cc)
		if got != tc.want || strings.Contains(got, "s3cret") {
			t.Errorf("healthDatabase(%q) = %q, want %q", tc.dsn, got, tc.want)
		}
	}
}

// TestServerOf: shared budgets are keyed by the server and database, whoever connects: the
// hosts, the database and target_session_attrs, without the user, the session's parameters or
// the password. A primary and its standbys behind one host list are apart.
func TestServerOf(t *testing.T) {
	of := func(dsn string) string {
		cc, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		return serverOf(cc)
	}
	web, worker := of("postgres://web:s3cret@db1/orders?application_name=web"), of("postgres://worker@db1/orders?search_path=w")
	if web != worker || web != "db1:5432/orders" {
		t.Errorf("one server: %q and %q", web, worker)
	}
	if p, s := of("postgres://app@db1,db2/orders?target_session_attrs=primary"),
		of("postgres://app@db1,db2/orders?target_session_attrs=standby"); p == s {
		t.Errorf("a primary and a standby share %q", p)
	}
	if a, b := of("postgres://app@shard1/orders"), of("postgres://app@shard2/orders"); a == b {
		t.Errorf("two shards share %q", a)
	}
}
