package driver

import (
	"context"
	"database/sql"
	"strings"
	"testing"
)

// A keyword/value DSN may put spaces around '=' (libpq's syntax, which pgx parses): the errors
// of NewConnector, Open and sql.Open("pgtraffic", …) for a DSN that fails to parse must not
// quote its password however it is spaced.
func TestSecretDSNSpacedKeyword(t *testing.T) {
	for _, dsn := range []string{
		"host=h port=x user=u password = S3CRET-PW dbname=d",
		"host=h port=x user=u password= S3CRET-PW dbname=d",
		"host=h port=x user=u password =S3CRET-PW dbname=d",
		"host=h port=x user=u password = 'S3CRET PW' dbname=d",
		"host=h port=x user=u\tpassword\t=\tS3CRET-PW dbname=d",
		// An unquoted space in the password: pgx's reason quotes the word after it.
		"host=h user=u password=S3CRET-A S3CRET-B dbname=d",
		"host=h user=u password=S3CRET-A\tS3CRET-B dbname=d",
		// Key material where pgx wants a file's path: its reason quotes the path.
		"host=h user=u sslmode=require sslkey='-----BEGIN PRIVATE KEY-----S3CRET-KEY' sslcert=/nonexistent/c dbname=d",
		"host=h user=u sslmode=verify-full sslrootcert='S3CRET-ROOT-PEM' dbname=d",
	} {
		var errs []error
		_, err := NewConnector(dsn)
		errs = append(errs, err)
		_, err = Open(dsn)
		errs = append(errs, err)
		db, err := sql.Open(Name, dsn)
		errs = append(errs, err)
		if err == nil {
			errs = append(errs, db.PingContext(context.Background()))
			db.Close()
		}
		for _, err := range errs {
			if err == nil {
				t.Errorf("%q: parsed without an error", dsn)
			} else if strings.Contains(err.Error(), "S3CRET") {
				t.Errorf("%q: error quotes the password: %v", dsn, err)
			}
		}
	}
}
