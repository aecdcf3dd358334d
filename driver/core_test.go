package driver

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestHealthDatabase: the identity the health sampler election is keyed by names the user,
// every host and port and the database, and never the password.
func TestHealthDatabase(t *testing.T) {
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://app:s3cret@db1:5433/orders", "app@db1:5433/orders"},
		{"postgres://app:s3cret@db1:5433,db2:5434/orders", "app@db1:5433,db2:5434/orders"},
		{"host=/run/postgresql user=app password=s3cret dbname=orders", "app@/run/postgresql:5432/orders"},
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
