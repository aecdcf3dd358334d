package rules

import (
	"encoding/json"
	"errors"
	"math"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// TestValidateInCode checks configs built in code: same checks, field paths, no lines, and
// zero fields meaning "omitted".
func TestValidateInCode(t *testing.T) {
	a := Budget{Name: "a"}
	tests := []struct {
		name string
		cfg  Config
		want []string // "" = valid
	}{
		{"zero config", Config{}, nil},
		{"zero fields are omitted", Config{Budgets: []Budget{a}, Rules: []Rule{{Budget: "a", Match: map[string]string{"app": "x"}}}}, nil},
		{"full", *fullWant, nil},
		{"negative cores", Config{ServerCores: -1}, []string{"server_cores: must be a number > 0, got -1"}},
		{"NaN cores", Config{ServerCores: math.NaN()}, []string{"server_cores: must be a number > 0, got NaN"}},
		{"negative interval", Config{HealthInterval: -1}, []string{"health_interval: must not be negative, got -1ns"}},
		{"budget problems", Config{Budgets: []Budget{{
			Mode: "loud", MaxConcurrent: new(-1), PerQueryLimit: -1, ServerShare: new(float64(2)), WarningThreshold: 1,
			MaxWait: -1, Explain: "x", ThrottleWhen: map[string]float64{"custom.q": 1, "cpu": math.Inf(1)},
		}}}, []string{
			"budgets[0].name: required",
			`budgets[0].mode: unknown mode "loud" (want enforce, warn or off)`,
			"budgets[0].max_concurrent: must be >= 0 (0 admits nothing; omit it for no limit), got -1",
			"budgets[0].per_query_limit: must not be negative, got -1ns",
			"budgets[0].server_share: must be in [0, 1], got 2",
			"budgets[0].warning_threshold: must be in (0, 1), got 1",
			"budgets[0].max_wait: must not be negative, got -1ns",
			"budgets[0].throttle_when.cpu: unknown metric (want active_queries, replication_lag, in_flight or custom.<name>)",
			"budgets[0].throttle_when.cpu: must be a number >= 0, got +Inf",
			`budgets[0].throttle_when.custom.q: no health query named "q" in health_queries`,
			`budgets[0].explain: unknown value "x" (want auto, pattern or call)`,
		}},
		{"name with spaces", Config{Budgets: []Budget{{Name: " a"}}}, []string{`budgets[0].name: leading or trailing spaces or control characters in " a"`}},
		{"burst without share", Config{Budgets: []Budget{{Name: "a", BurstLimit: Duration(time.Second)}}}, []string{"budgets[0].burst_limit: needs server_share (the rate the bucket drains at)"}},
		{"max_queue", Config{Budgets: []Budget{
			{Name: "a", MaxWait: Duration(time.Second), MaxQueue: new(0)},
			{Name: "b", MaxWait: Duration(time.Second), MaxQueue: new(-1)},
			{Name: "c", MaxConcurrent: new(2), MaxQueue: new(4)},
			{Name: "d", MaxQueue: new(-2)},
		}}, []string{
			"budgets[1].max_queue: must be >= 0, got -1",
			"budgets[2].max_queue: has no effect without max_wait (only statements that may wait are queued)",
			"budgets[3].max_queue: must be >= 0, got -2",
			"budgets[3].max_queue: has no effect without max_wait (only statements that may wait are queued)",
		}},
		{"duplicate names", Config{Budgets: []Budget{a, a, a}}, []string{
			`budgets[1].name: duplicate budget name "a" (also budgets[0])`,
			`budgets[2].name: duplicate budget name "a" (also budgets[0])`,
		}},
		{"rules", Config{Budgets: []Budget{a}, Rules: []Rule{
			{Budget: "b", Match: map[string]string{"ip": "10.0.0.0/99"}},
			{Budget: "a"},
		}}, []string{
			`rules[0].budget: unknown budget "b"`,
			`rules[0].match.ip: invalid CIDR prefix "10.0.0.0/99"`,
			"rules[1].match: required: a rule must match at least one tag",
		}},
		{"guards", Config{Guards: Guards{
			RequireWhere:  Guard{Match: map[string]string{"app": "web"}},
			BlockTruncate: Guard{Mode: "never"},
		}}, []string{
			"guards.require_where.mode: required with match (a guard without a mode is off)",
			`guards.block_truncate.mode: unknown mode "never" (want enforce, warn or off)`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := tt.cfg.Clone()
			err := tt.cfg.Validate()
			if dump(t, before) != dump(t, &tt.cfg) { // not DeepEqual: NaN != NaN
				t.Errorf("Validate modified its receiver")
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var want []string
			for _, w := range tt.want {
				want = append(want, "pgtraffic: rules: "+w)
			}
			if err == nil || err.Error() != strings.Join(want, "\n") {
				t.Errorf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
			}
			var e *Error
			if !errors.As(err, &e) || e.Line != 0 || e.Field == "" {
				t.Errorf("errors.As: %#v; want a field and no line", e)
			}
		})
	}
}

func TestWithDefaults(t *testing.T) {
	in := &Config{
		ServerCores: 4,
		Budgets: []Budget{
			{Name: "a", ServerShare: new(float64(0.5))}, {Name: "b", ServerShare: new(float64(1e-12)), Mode: ModeOff},
			{Name: "c", MaxConcurrent: new(3), MaxWait: Duration(time.Second)},
			{Name: "d", MaxWait: Duration(time.Second)},
			{Name: "e", MaxConcurrent: new(3)},
		},
		Rules:  []Rule{},
		Guards: Guards{RequireWhere: Guard{Mode: ModeEnforce, Match: map[string]string{}}},
	}
	got := in.WithDefaults()
	want := &Config{
		ServerCores: 4, HealthInterval: Duration(time.Second),
		Budgets: []Budget{
			{Name: "a", Mode: ModeWarn, ServerShare: new(float64(0.5)), BurstLimit: Duration(2 * time.Second), Explain: ExplainAuto},
			{Name: "b", Mode: ModeOff, ServerShare: new(float64(1e-12)), BurstLimit: 1, Explain: ExplainAuto},
			{Name: "c", Mode: ModeWarn, MaxConcurrent: new(3), MaxWait: Duration(time.Second), MaxQueue: new(3), Explain: ExplainAuto},
			{Name: "d", Mode: ModeWarn, MaxWait: Duration(time.Second), MaxQueue: new(DefaultMaxQueue), Explain: ExplainAuto},
			{Name: "e", Mode: ModeWarn, MaxConcurrent: new(3), Explain: ExplainAuto},
		},
		Guards: Guards{RequireWhere: Guard{Mode: ModeEnforce}, BlockTruncate: Guard{Mode: ModeOff}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
	if in.Budgets[0].Mode != "" || in.Budgets[2].MaxQueue != nil || in.Rules == nil {
		t.Errorf("WithDefaults modified its receiver")
	}
	if again := got.WithDefaults(); !reflect.DeepEqual(again, got) {
		t.Errorf("WithDefaults is not idempotent")
	}

	// With a coordination section, its defaults and shared (but not a budget's shared: false).
	in = &Config{Coordination: &Coordination{}, Budgets: []Budget{{Name: "a"}, {Name: "b", Shared: new(false)}}}
	got = in.WithDefaults()
	if co := got.Coordination; co.SyncInterval != Duration(DefaultSyncInterval) || co.FallbackInstances != DefaultFallbackInstances {
		t.Errorf("coordination defaults: %v, fallback_instances %d", co, co.FallbackInstances)
	}
	if a, b := got.Budgets[0].Shared, got.Budgets[1].Shared; a == nil || !*a || b == nil || *b {
		t.Errorf("shared: %v, %v; want true (the default), false", a, b)
	}
	if in.Budgets[0].Shared != nil {
		t.Errorf("WithDefaults modified its receiver")
	}
}

// TestQueueBound: an explicit max_queue, else max_concurrent above 0, else DefaultMaxQueue.
func TestQueueBound(t *testing.T) {
	tests := []struct {
		name string
		b    Budget
		want int
	}{
		{"nothing set", Budget{}, DefaultMaxQueue},
		{"max_concurrent", Budget{MaxConcurrent: new(3)}, 3},
		{"max_concurrent 0", Budget{MaxConcurrent: new(0)}, DefaultMaxQueue},
		{"max_concurrent above the default", Budget{MaxConcurrent: new(50)}, 50},
		{"explicit", Budget{MaxConcurrent: new(3), MaxQueue: new(5)}, 5},
		{"explicit 0", Budget{MaxConcurrent: new(3), MaxQueue: new(0)}, 0},
		{"explicit, no max_concurrent", Budget{MaxQueue: new(1)}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.b.QueueBound(); got != tt.want {
				t.Errorf("QueueBound() = %d, want %d", got, tt.want)
			}
		})
	}
	if DefaultMaxQueue != 8 {
		t.Errorf("DefaultMaxQueue = %d; the documentation says 8", DefaultMaxQueue)
	}
}

func TestCloneIsDeep(t *testing.T) {
	orig := parseFile(t, "testdata/full.yaml") // shares no pointer with fullWant
	c := orig.Clone()
	c.HealthQueries["locks"] = "x"
	c.Budgets[0].ThrottleWhen["active_queries"] = 1
	*c.Budgets[0].MaxQueue = 99
	c.Budgets[1].Name = "x"
	c.Rules[0].Match["app"] = "x"
	c.Guards.BlockTruncate.Match["app"] = "x"
	if !reflect.DeepEqual(orig, fullWant) {
		t.Errorf("changing a clone changed the original")
	}
}

func TestRuleString(t *testing.T) {
	if got := fullWant.Rules[1].String(); got != "app=commerce,controller=export" {
		t.Errorf("Rule.String = %q", got)
	}
}

func TestParseMatchValue(t *testing.T) {
	tests := []struct {
		in       string
		want     string // prefix, "" for an exact value
		isPrefix bool
		err      bool
	}{
		{"reporting", "", false, false},
		{"", "", false, false},
		{"/api/export", "", false, false},
		{"db.a/x", "", false, false},
		{"v1.2/beta", "", false, false},
		{"fe80::1%eth0/64", "", false, false},
		{"203.0.113.0/24", "203.0.113.0/24", true, false},
		{"203.0.113.7/24", "203.0.113.0/24", true, false}, // host bits are masked
		{"2001:db8::/32", "2001:db8::/32", true, false},
		{"::/0", "::/0", true, false},
		{"::ffff:203.0.113.0/120", "203.0.113.0/24", true, false},
		{"::ffff:0:0/96", "0.0.0.0/0", true, false},
		{"10.0.0.0/33", "", true, true},
		{"10.0.0/8", "", true, true},
		{"1.2.3.4/", "", true, true},
		{"abcd::/200", "", true, true},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			p, isPrefix, err := ParseMatchValue(tt.in)
			if isPrefix != tt.isPrefix || (err != nil) != tt.err {
				t.Fatalf("= %v, %v, %v; want isPrefix %v, err %v", p, isPrefix, err, tt.isPrefix, tt.err)
			}
			if tt.want != "" && p != netip.MustParsePrefix(tt.want) {
				t.Errorf("prefix = %v, want %v", p, tt.want)
			}
		})
	}
}

func TestGuardMarshal(t *testing.T) {
	tests := []struct {
		g        Guard
		yml, jsn string
	}{
		{Guard{Mode: ModeEnforce}, "enforce\n", `"enforce"`},
		{Guard{Mode: ModeWarn, Match: map[string]string{"app": "web"}}, "mode: warn\nmatch:\n    app: web\n", `{"mode":"warn","match":{"app":"web"}}`},
	}
	for _, tt := range tests {
		t.Run(string(tt.g.Mode), func(t *testing.T) {
			y, err := yaml.Marshal(tt.g)
			if err != nil || string(y) != tt.yml {
				t.Errorf("yaml = %q, %v; want %q", y, err, tt.yml)
			}
			j, err := json.Marshal(tt.g)
			if err != nil || string(j) != tt.jsn {
				t.Errorf("json = %s, %v; want %s", j, err, tt.jsn)
			}
		})
	}
}

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		e    Error
		want string
	}{
		{Error{Line: 7, Field: "budgets[1].x", Msg: "unknown field"}, "pgtraffic: rules line 7: budgets[1].x: unknown field"},
		{Error{Field: "server_cores", Msg: "bad"}, "pgtraffic: rules: server_cores: bad"},
		{Error{Line: 2, Msg: "syntax"}, "pgtraffic: rules line 2: syntax"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := tt.e.Error(); got != tt.want {
				t.Errorf("got %q", got)
			}
		})
	}
}

// dump renders c for a comparison that sees through its pointers and, unlike
// reflect.DeepEqual, takes NaN for NaN.
func dump(t *testing.T, c *Config) string {
	t.Helper()
	out, err := yaml.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
