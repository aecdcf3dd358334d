package driver

import (
	"database/sql"
	"testing"
)

// A connector's Driver is the registered pgtraffic driver, the same value on every call, as
// database/sql's DB.Driver reports it.
func TestConnectorDriver(t *testing.T) {
	c, err := NewConnector("postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Driver() != c.Driver() {
		t.Error("Connector.Driver returns a new driver on each call")
	}
	db, err := sql.Open(Name, "postgres://u@127.0.0.1:1/db")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if db.Driver() != c.Driver() {
		t.Error("the connector's driver is not the one registered as " + Name)
	}
}
