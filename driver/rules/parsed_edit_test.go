package rules

import (
	"testing"
	"time"
)

// TestParsedConfigWithoutCoordination: a program reads its rules file with Parse
// (driver.ParseConfig) and, for a run without Redis (a developer's machine, a test), drops the
// coordination section in code before driver.WithConfig: budgets are process-local when
// coordination is absent (Config.IsShared). The file never says shared:, so the config stays
// valid: Parse leaves the default shared omitted (IsShared reads it as "shared when there is a
// coordination section") rather than make it explicit, where Validate would take it for one the
// author wrote ("needs a coordination section").
func TestParsedConfigWithoutCoordination(t *testing.T) {
	cfg, err := Parse([]byte("coordination: {redis: 'redis://127.0.0.1:6379/0'}\n" +
		"budgets: [{name: reporting, mode: enforce, max_concurrent: 4}]\n" +
		"rules: [{budget: reporting, match: {app: reporting}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	local := cfg.Clone()
	local.Coordination = nil
	if err := local.Validate(); err != nil {
		t.Fatalf("the parsed config without its coordination section is refused: %v", err)
	}
}

// TestParsedConfigEdited: a parsed config stays valid, and its defaults follow, when a program
// changes in code a field that other defaults follow: max_wait (max_queue), server_share and
// server_cores (burst_limit), the coordination section (shared).
func TestParsedConfigEdited(t *testing.T) {
	cfg, err := Parse([]byte("server_cores: 4\n" +
		"budgets: [{name: a, max_concurrent: 4, max_wait: 100ms, server_share: 0.5}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	edited := cfg.Clone()
	b := &edited.Budgets[0]
	b.MaxWait = 0       // no waiting: no queue
	b.ServerShare = nil // no bucket: no burst
	if err := edited.Validate(); err != nil {
		t.Fatalf("the parsed config without max_wait and server_share is refused: %v", err)
	}

	edited = cfg.Clone()
	edited.ServerCores = 8
	*edited.Budgets[0].ServerShare = 0.25
	if got, want := edited.WithDefaults().Budgets[0].BurstLimit, Duration(2*time.Second); got != want {
		t.Errorf("burst_limit %v after server_cores and server_share changed; want %v (0.25 × 8 × 1s)", got, want)
	}
	if got, want := cfg.WithDefaults().Budgets[0].BurstLimit, Duration(2*time.Second); got != want {
		t.Errorf("burst_limit %v as parsed; want %v (0.5 × 4 × 1s)", got, want)
	}
	if q := cfg.Budgets[0].QueueBound(); q != 4 {
		t.Errorf("queue bound %d; want max_concurrent, 4", q)
	}

	edited = cfg.Clone()
	edited.Coordination = &Coordination{Redis: "redis://127.0.0.1:6379/0"}
	if err := edited.Validate(); err != nil || !edited.IsShared(&edited.Budgets[0]) {
		t.Errorf("with a coordination section added in code: %v, shared %v; want valid and shared", err, edited.IsShared(&edited.Budgets[0]))
	}
}
