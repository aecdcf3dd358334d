package main

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// The README's quick look is `go run . -runs 1 -only equal,slots`, and -only is documented as
// "comma-separated scenarios to run". A user who mistypes a scenario (`-only equl`) expects the
// program to say so, as every other example refuses a bad flag (noisy-neighbor and batchjob
// print the problem and exit 2). The unknown name was silently skipped: the program started
// PostgreSQL and redis-server, ran nothing (or only the names it recognised), printed no table
// and exited 0, so the typo looked like a clean run. The test builds the program and runs it
// with an unknown scenario name, alone and in a list written with a space after the comma: it
// must exit 2, naming the unknown scenario, before it starts any server.
func TestOnlyRejectsUnknownScenario(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "shared-budget")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	// Generous: if the name is (wrongly) accepted, the program starts both servers first.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, tc := range []struct{ only, unknown string }{
		{"equl", "equl"},
		{"equal, slotz", "slotz"},
	} {
		cmd := exec.CommandContext(ctx, bin, "-runs", "1", "-procs", "2", "-duration", "2s", "-warmup", "1s", "-only", tc.only)
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("-only %q: still running after 3 minutes; output:\n%s", tc.only, out)
		}
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 {
			t.Errorf("-only %q: %v; want exit status 2. Output:\n%s", tc.only, err, out)
		}
		if want := `unknown scenario "` + tc.unknown + `"`; !strings.Contains(string(out), want) {
			t.Errorf("-only %q: the output does not say %s:\n%s", tc.only, want, out)
		}
		if strings.Contains(string(out), "starting") {
			t.Errorf("-only %q: a server was started before the name was refused:\n%s", tc.only, out)
		}
	}
}

// -only takes the list as most lists are written: a space after a comma is not part of a name.
func TestParseOnly(t *testing.T) {
	for _, tc := range []struct {
		only    string
		want    []string
		wantErr string
	}{
		{only: "", want: nil},
		{only: "equal,slots", want: []string{"equal", "slots"}},
		{only: "equal, slots", want: []string{"equal", "slots"}},
		{only: " 10:1 ,tenants ", want: []string{"10:1", "tenants"}},
		{only: "equl", wantErr: `unknown scenario "equl"`},
		{only: "equal,", wantErr: `unknown scenario ""`},
	} {
		t.Run(tc.only, func(t *testing.T) {
			got, err := parseOnly(tc.only)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("parseOnly(%q) = %v, %v; want an error saying %s", tc.only, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("parseOnly(%q) = %q, %v; want %q", tc.only, got, err, tc.want)
			}
		})
	}
}
