package integration

import (
	"database/sql"
	"testing"
	"time"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pgtest"
	"github.com/pgtraffic/pgtraffic/internal/redistest"
)

// TestSharedRestartEmptyStaysWithinLimit: Redis killed and restarted empty while two
// instances are busy: the fleet never runs more than max_concurrent at once.
func TestSharedRestartEmptyStaysWithinLimit(t *testing.T) {
	srv := redistest.Need(t)
	dsn := pgtest.Shared(t).CreateDatabase(t)
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	var logs lockedBuffer
	var cs []*driver.Connector
	var dbs []*sql.DB
	for range 2 {
		c, db := openShared(t, dsn, reviewRules(srv.URL, "100ms", 4, ""), &logs)
		db.SetMaxOpenConns(8)
		cs, dbs = append(cs, c), append(dbs, db)
	}
	for i, c := range cs {
		if !eventually(5*time.Second, func() bool { return sharedStatus(t, c, "slots").Instances == 2 }) {
			t.Fatalf("instance %d: %+v", i, sharedStatus(t, c, "slots"))
		}
	}
	go func() {
		time.Sleep(700 * time.Millisecond)
		if err := srv.Kill(); err != nil {
			t.Error(err)
			return
		}
		time.Sleep(300 * time.Millisecond)
		if err := srv.Restart(); err != nil {
			t.Error(err)
		}
	}()
	most, ran, refused := fleetMost(t, admin, dbs, "reviewrestart", 500*time.Millisecond, 3*time.Second)
	t.Logf("at most %d at once, %d ran, %d refused; A %+v", most, ran, refused, sharedStatus(t, cs[0], "slots"))
	if most > 4 {
		t.Errorf("around a Redis restart the fleet ran %d at once, limit 4", most)
	}
}
