package driver

import (
	"context"
	"database/sql"
	"strings"
	"testing"
)

// TestSecretDSN checks that a DSN's password is not quoted by the errors of Open,
// NewConnector, NewPool and the registered driver.
func TestSecretDSN(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:S3CRET-PW@host:badport/db",
		"postgres://u:S3CRET-PW@host/db?sslmode=bogus",
		"postgres://u:S3CRET%zz@host/db",
		"host=h port=x user=u password=S3CRET-PW dbname=d",
		"host=h user=u password='S3CRET PW' dbname=d sslmode=bogus",
		"host=h user=u password=S3CRET-PW dbname=d pool_max_conns=x",
		"postgres://u:S3CRET-PW@host/db?pool_max_conns=x",
	} {
		var errs []error
		_, err := NewConnector(dsn)
		errs = append(errs, err)
		_, err = NewPool(context.Background(), dsn)
		errs = append(errs, err)
		if db, err := sql.Open("pgtraffic", dsn); err == nil {
			errs = append(errs, db.PingContext(context.Background()))
			db.Close()
		}
		for _, err := range errs {
			if err != nil && strings.Contains(err.Error(), "S3CRET") {
				t.Errorf("%q: error quotes the password: %v", dsn, err)
			}
		}
	}
}
