package driver

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestNewConnectorFromConfigErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  *pgx.ConnConfig
		want string
	}{
		{"nil", nil, "pgtraffic: NewConnectorFromConfig: the pgx.ConnConfig is nil"},
		{"not from ParseConfig", &pgx.ConnConfig{}, "pgtraffic: NewConnectorFromConfig: the pgx.ConnConfig must be created by pgx.ParseConfig"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewConnectorFromConfig(tt.cfg)
			if err == nil || err.Error() != tt.want {
				if c != nil {
					c.Close()
				}
				t.Fatalf("NewConnectorFromConfig = %v, want %q", err, tt.want)
			}
		})
	}
}

// TestDriverOpenMakesConnectorsUnlocked: Driver.Open keeps one connector per DSN, and making one
// reads files (here the DSN's passfile, a FIFO no one writes yet, as a slow file system would
// be), compiles the rules and runs the application's telemetry. While it does, an Open of another
// DSN must not wait for it; and two Opens of one DSN still share one connector.
func TestDriverOpenMakesConnectorsUnlocked(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "pgpass")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	d := &Driver{}
	slow := "postgres://u@127.0.0.1:1/db?connect_timeout=1&passfile=" + fifo
	slowDone := make(chan struct{})
	go func() {
		defer close(slowDone)
		_, _ = d.Open(slow) // nothing listens on port 1: its connection fails, once its passfile is read
	}()
	time.Sleep(200 * time.Millisecond) // let it reach the passfile
	other := make(chan error, 1)
	go func() {
		_, err := d.Open("postgres://u:p@127.0.0.1:1/db?connect_timeout=1")
		other <- err
	}()
	select {
	case err := <-other:
		if err == nil {
			t.Error("an Open of a port where nothing listens succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Error("an Open of another DSN waited for the connector of a DSN whose passfile is slow to read")
	}
	w, err := os.OpenFile(fifo, os.O_WRONLY, 0) // the slow read ends
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.WriteString("*:*:*:*:secret\n")
	w.Close()
	<-slowDone
	kept := d.open[slow]
	_, _ = d.Open(slow)
	if kept == nil || d.open[slow] != kept || len(d.open) != 2 {
		t.Errorf("connectors kept: %d, the slow DSN's %p then %p; want one per DSN", len(d.open), kept, d.open[slow])
	}
	for _, c := range d.open {
		c.Close()
	}
}
