package main

import (
	"testing"

	"github.com/pgtraffic/pgtraffic/internal/pgtest"
)

// TestCommandModes runs the command as make instr does, briefly, in every mode on both
// workloads: each must answer correctly and take the path it claims (handle.check).
func TestCommandModes(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	for _, workload := range []string{"select", "update"} {
		for _, m := range modes {
			t.Run(workload+"/"+m.name, func(t *testing.T) {
				if err := run(dsn, m.name, workload, 20, 10); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestCommandRejects: a mode or workload the command does not have is an error, not a run of
// another one.
func TestCommandRejects(t *testing.T) {
	dsn := pgtest.Shared(t).CreateDatabase(t)
	for _, tc := range []struct{ mode, workload string }{
		{"pgbouncer", "select"},
		{"pool", "delete"},
	} {
		if err := run(dsn, tc.mode, tc.workload, 1, 0); err == nil {
			t.Errorf("mode %s, workload %s: no error", tc.mode, tc.workload)
		}
	}
}
