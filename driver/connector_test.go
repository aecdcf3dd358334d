package driver

import (
	"testing"

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
