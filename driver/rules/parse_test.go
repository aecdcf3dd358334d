package rules

import (
	"encoding/json"
	"errors"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// fullWant is testdata/full.yaml as Parse returns it, defaults filled in.
var fullWant = &Config{
	ServerCores:    8,
	HealthInterval: Duration(500 * time.Millisecond),
	HealthQueries:  map[string]string{"locks": "select count(*) from pg_locks where not granted"},
	Budgets: []Budget{
		{
			Name: "reporting", Mode: ModeEnforce, MaxConcurrent: new(4),
			PerQueryLimit: Duration(2 * time.Second), ServerShare: new(float64(0.25)), BurstLimit: Duration(10 * time.Second),
			WarningThreshold: 0.8, MaxWait: Duration(250 * time.Millisecond), MaxQueue: new(6), Explain: ExplainPattern,
			ThrottleWhen: map[string]float64{"active_queries": 50, "replication_lag": 5, "custom.locks": 20},
		},
		{
			// burst_limit is omitted: its default follows server_share (see Config.WithDefaults)
			Name: "per-tenant", Mode: ModeWarn, Per: "tenant", ServerShare: new(float64(0.05)), Explain: ExplainAuto,
		},
		{
			Name: "batch", Mode: ModeEnforce, MaxConcurrent: new(2), Explain: ExplainCall,
			MaxDuration: Duration(30 * time.Second), Quarantine: &Quarantine{After: 3, For: Duration(10 * time.Minute)},
			ThrottleWhen: map[string]float64{"in_flight": 16, "replication_lag": 1.5},
		},
	},
	Rules: []Rule{
		{Budget: "reporting", Match: map[string]string{"app": "reporting"}},
		{Budget: "reporting", Match: map[string]string{"app": "commerce", "controller": "export"}},
		{Budget: "per-tenant", Match: map[string]string{"remote_address": "203.0.113.0/24"},
			Until: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)},
		{Budget: "batch", Match: map[string]string{"application_name": "nightly-etl", "table": "orders"}},
	},
	Guards: Guards{
		RequireWhere:  Guard{Mode: ModeEnforce},
		BlockTruncate: Guard{Mode: ModeWarn, Match: map[string]string{"app": "web"}},
	},
}

func parseFile(t *testing.T, name string) *Config {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := Parse(data)
	if err != nil {
		t.Fatalf("Parse(%s): %v", name, err)
	}
	return cfg
}

func TestParseFull(t *testing.T) {
	for _, name := range []string{"testdata/full.yaml", "testdata/full.json"} {
		t.Run(name, func(t *testing.T) {
			got := parseFile(t, name)
			if !reflect.DeepEqual(got, fullWant) {
				t.Errorf("Parse(%s) =\n%#v\nwant\n%#v", name, got, fullWant)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Validate of a parsed config: %v", err)
			}
		})
	}
}

// TestRoundTrip re-encodes a parsed config as YAML and as JSON and parses it back.
func TestRoundTrip(t *testing.T) {
	cfg := parseFile(t, "testdata/full.yaml")
	for _, enc := range []struct {
		name    string
		marshal func(any) ([]byte, error)
	}{
		{"yaml", yaml.Marshal},
		{"json", json.Marshal},
	} {
		t.Run(enc.name, func(t *testing.T) {
			data, err := enc.marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(data)
			if err != nil {
				t.Fatalf("Parse(%s):\n%s\n%v", enc.name, data, err)
			}
			if !reflect.DeepEqual(got, cfg) {
				t.Errorf("round trip through %s:\n%s\ngot  %#v\nwant %#v", enc.name, data, got, cfg)
			}
		})
	}
}

func TestParseDefaults(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *Config
	}{
		{"empty mapping", `{}`, &Config{
			ServerCores: 1, HealthInterval: Duration(time.Second),
			Guards: Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"budget defaults", "server_cores: 2\nbudgets: [{name: a, server_share: 0.5}, {name: b}]", &Config{
			ServerCores: 2, HealthInterval: Duration(time.Second),
			Budgets: []Budget{
				// burst_limit stays omitted: its default follows server_share and server_cores
				{Name: "a", Mode: ModeWarn, ServerShare: new(float64(0.5)), Explain: ExplainAuto},
				{Name: "b", Mode: ModeWarn, Explain: ExplainAuto},
			},
			Guards: Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"nulls are omitted fields", "server_cores: ~\nbudgets:\nrules: null\nguards: {require_where: ~}", &Config{
			ServerCores: 1, HealthInterval: Duration(time.Second),
			Guards: Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"scalar match values are their text", "budgets: [{name: a}]\nrules: [{budget: a, match: {port: 5432, ok: true, f: 1.50}}]", &Config{
			ServerCores: 1, HealthInterval: Duration(time.Second),
			Budgets: []Budget{{Name: "a", Mode: ModeWarn, Explain: ExplainAuto}},
			Rules:   []Rule{{Budget: "a", Match: map[string]string{"port": "5432", "ok": "true", "f": "1.50"}}},
			Guards:  Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"aliases are followed", "budgets: [{name: a}]\nrules:\n- {budget: a, match: &m {app: x}}\n- {budget: a, match: *m}", &Config{
			ServerCores: 1, HealthInterval: Duration(time.Second),
			Budgets: []Budget{{Name: "a", Mode: ModeWarn, Explain: ExplainAuto}},
			Rules: []Rule{
				{Budget: "a", Match: map[string]string{"app": "x"}},
				{Budget: "a", Match: map[string]string{"app": "x"}},
			},
			Guards: Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"zero max_wait and routes with slashes", "budgets: [{name: a, max_wait: 0s}]\nrules: [{budget: a, match: {route: /api/export, v: v1.2/beta}}]", &Config{
			ServerCores: 1, HealthInterval: Duration(time.Second),
			Budgets: []Budget{{Name: "a", Mode: ModeWarn, Explain: ExplainAuto}},
			Rules:   []Rule{{Budget: "a", Match: map[string]string{"route": "/api/export", "v": "v1.2/beta"}}},
			Guards:  Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
		{"JSON with tabs", "{\n\t\"server_cores\": 4,\n\t\"budgets\": [\n\t\t{\"name\": \"a\", \"per_query_limit\": \"1m\"}\n\t]\n}", &Config{
			ServerCores: 4, HealthInterval: Duration(time.Second),
			Budgets: []Budget{{Name: "a", Mode: ModeWarn, PerQueryLimit: Duration(time.Minute), Explain: ExplainAuto}},
			Guards:  Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %#v\nwant %#v", got, tt.want)
			}
		})
	}
}

// queueDefaults is what WithDefaults makes of both files of TestParseDefaults' max_queue cases:
// an omitted max_queue is max_concurrent, or DefaultMaxQueue without one above 0, where
// max_wait is set. (Parse leaves it omitted, as it follows max_wait and max_concurrent.)
var queueDefaults = &Config{
	ServerCores: 1, HealthInterval: Duration(time.Second),
	Budgets: []Budget{
		{Name: "a", Mode: ModeWarn, MaxConcurrent: new(3), MaxWait: Duration(time.Second), MaxQueue: new(3), Explain: ExplainAuto},
		{Name: "b", Mode: ModeWarn, MaxWait: Duration(time.Second), MaxQueue: new(8), Explain: ExplainAuto},
		{Name: "c", Mode: ModeWarn, MaxConcurrent: new(0), MaxWait: Duration(time.Second), MaxQueue: new(8), Explain: ExplainAuto},
		{Name: "d", Mode: ModeWarn, MaxConcurrent: new(3), MaxWait: Duration(time.Second), MaxQueue: new(0), Explain: ExplainAuto},
		{Name: "e", Mode: ModeWarn, MaxConcurrent: new(3), MaxWait: Duration(time.Second), MaxQueue: new(20), Explain: ExplainAuto},
		{Name: "f", Mode: ModeWarn, MaxWait: Duration(time.Second), MaxQueue: new(8), Explain: ExplainAuto},
		{Name: "g", Mode: ModeWarn, MaxConcurrent: new(3), Explain: ExplainAuto},
	},
	Guards: Guards{RequireWhere: Guard{Mode: ModeOff}, BlockTruncate: Guard{Mode: ModeOff}},
}

// TestQueueDefaults: Parse leaves an omitted max_queue omitted, as it follows max_wait and
// max_concurrent; WithDefaults makes it explicit (queueDefaults), in YAML and in JSON.
func TestQueueDefaults(t *testing.T) {
	for _, in := range []string{
		"budgets:\n" +
			"- {name: a, max_concurrent: 3, max_wait: 1s}\n" +
			"- {name: b, max_wait: 1s}\n" +
			"- {name: c, max_concurrent: 0, max_wait: 1s}\n" +
			"- {name: d, max_concurrent: 3, max_wait: 1s, max_queue: 0}\n" +
			"- {name: e, max_concurrent: 3, max_wait: 1s, max_queue: 20}\n" +
			"- {name: f, max_wait: 1s, max_queue: ~}\n" +
			"- {name: g, max_concurrent: 3}\n",
		`{"budgets": [
			{"name": "a", "max_concurrent": 3, "max_wait": "1s"},
			{"name": "b", "max_wait": "1s"},
			{"name": "c", "max_concurrent": 0, "max_wait": "1s"},
			{"name": "d", "max_concurrent": 3, "max_wait": "1s", "max_queue": 0},
			{"name": "e", "max_concurrent": 3, "max_wait": "1s", "max_queue": 20},
			{"name": "f", "max_wait": "1s", "max_queue": null},
			{"name": "g", "max_concurrent": 3}]}`,
	} {
		cfg, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%s): %v", in, err)
		}
		for i, b := range cfg.Budgets {
			if written := b.Name == "d" || b.Name == "e"; (b.MaxQueue != nil) != written {
				t.Errorf("Parse(%s): budgets[%d].max_queue = %v; want it set only where written", in, i, b.MaxQueue)
			}
		}
		if got := cfg.WithDefaults(); !reflect.DeepEqual(got, queueDefaults) {
			t.Errorf("WithDefaults of Parse(%s):\ngot  %#v\nwant %#v", in, got, queueDefaults)
		}
	}
}

// TestParseQueueBound: in a parsed file, QueueBound is the explicit max_queue or its default,
// in YAML and in JSON.
func TestParseQueueBound(t *testing.T) {
	for _, in := range []string{
		"budgets:\n- {name: a, max_concurrent: 3, max_wait: 1s}\n- {name: b, max_wait: 1s}\n- {name: c, max_wait: 1s, max_queue: 0}\n- {name: d, max_concurrent: 30, max_wait: 1s, max_queue: 2}\n",
		`{"budgets": [{"name": "a", "max_concurrent": 3, "max_wait": "1s"}, {"name": "b", "max_wait": "1s"},
			{"name": "c", "max_wait": "1s", "max_queue": 0}, {"name": "d", "max_concurrent": 30, "max_wait": "1s", "max_queue": 2}]}`,
	} {
		cfg, err := Parse([]byte(in))
		if err != nil {
			t.Fatalf("Parse(%s): %v", in, err)
		}
		var got []int
		for i := range cfg.Budgets {
			got = append(got, cfg.Budgets[i].QueueBound())
		}
		if want := []int{3, DefaultMaxQueue, 0, 2}; !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%s): QueueBound %v, want %v", in, got, want)
		}
	}
}

// TestParseErrors checks that each kind of mistake is caught and named with its line and
// field. want is the complete error text.
func TestParseErrors(t *testing.T) {
	const head = "budgets:\n  - name: a\n" // budget "a" on lines 2-
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"empty file", "", `pgtraffic: rules line 1: the file is empty (write {} for no rules)`},
		{"comments only", "# nothing\n", `pgtraffic: rules line 1: the file is empty (write {} for no rules)`},
		{"two documents", "{}\n---\n{}\n", `pgtraffic: rules line 2: a second YAML document: the file must hold one`},
		{"syntax", "budgets: [\n", `pgtraffic: rules line 1: did not find expected node content (at the end of the file)`},
		{"JSON syntax", "{\n  \"budgets\": [\n    {\"name\": \"a\",}\n  ]\n", `pgtraffic: rules line 4: did not find expected ',' or '}' (at the end of the file, in the mapping that begins on line 1)`},
		{"JSON trailing brace", "{\"budgets\": []}\n}\n", `pgtraffic: rules line 2: column 1 (byte offset 16): text after the end of the JSON document`},
		{"JSON trailing text", "{\"budgets\": []} x", `pgtraffic: rules line 1: column 17 (byte offset 16): text after the end of the JSON document`},
		{"two JSON documents", "{}\n{}\n", `pgtraffic: rules line 2: column 1 (byte offset 3): text after the end of the JSON document`},
		{"invalid UTF-8", "budgets:\n  - name: é\xff\n", `pgtraffic: rules line 2: column 12 (byte offset 21): invalid UTF-8 (byte 0xFF): the file must be UTF-8 text`},
		{"truncated UTF-8", "server_cores: 1\n# \xc3", `pgtraffic: rules line 2: column 3 (byte offset 18): invalid UTF-8 (byte 0xC3): the file must be UTF-8 text`},
		{"NUL byte", "budgets:\n  - name: a\x00b\n", `pgtraffic: rules line 2: column 12 (byte offset 20): control character U+0000: the file must be text`},
		{"NUL at the end", "server_cores: 1\n\x00", `pgtraffic: rules line 2: column 1 (byte offset 16): control character U+0000: the file must be text`},
		{"escape character", "budgets:\n  - name: \x1b[1m\n", `pgtraffic: rules line 2: column 11 (byte offset 19): control character U+001B: the file must be text`},
		{"unknown anchor", "budgets: *hunter2secret\n", `pgtraffic: rules line 1: unknown anchor (name not shown) referenced`},
		{"unclosed quote on line 1", "\"", `pgtraffic: rules line 1: found unexpected end of stream`},
		{"not a mapping", "- a\n", `pgtraffic: rules line 1: not a rules file: the file is a list, not a mapping of fields such as budgets and rules (its content is not shown)`},
		{"unknown top-level field", "server_core: 2\n", `pgtraffic: rules line 1: server_core: unknown field (did you mean server_cores?)`},
		{"unknown odd top-level key", "budgets: []\n\"a b\": 1\n", `pgtraffic: rules line 2: ["a b"]: unknown field`},
		{"unknown top-level key without a value", "server_cores: 2\nbudgts:\n", `pgtraffic: rules line 2: budgts: unknown field (did you mean budgets?)`},
		{"only an unknown key without a value", "budgts:\n", `pgtraffic: rules line 1: budgts: unknown field (did you mean budgets?)`},
		{"unknown budget key without a value", head + "    max_concurent:\n", `pgtraffic: rules line 3: budgets[0].max_concurent: unknown field (did you mean max_concurrent?)`},
		{"unknown guard without a value", "guards:\n  require_wher:\n", `pgtraffic: rules line 2: guards.require_wher: unknown field (did you mean require_where?)`},
		{"null throttle value", head + "    throttle_when: {active_queries: }\n", `pgtraffic: rules line 3: budgets[0].throttle_when.active_queries: expected a number, got null`},
		{"a file of keys without values", "root:$6$salt$hash:19000:0:99999:7:::\ndaemon:*:19000:0:99999:7:::\n",
			`pgtraffic: rules line 1: not a rules file: none of its top-level keys is a field such as budgets or rules (its content is not shown)`},
		{"a single value", "hello world\n", `pgtraffic: rules line 1: not a rules file: the file is a single value, not a mapping of fields such as budgets and rules (its content is not shown)`},
		{"a long value is cut", "server_cores: " + strings.Repeat("x", 100) + "\n", `pgtraffic: rules line 1: server_cores: expected a number, got "` + strings.Repeat("x", 32) + `"...`},
		{"a long key is cut", "budgets: []\n" + strings.Repeat("k", 100) + ": 1\n", `pgtraffic: rules line 2: ["` + strings.Repeat("k", 32) + `"...]: unknown field`},
		{"unknown budget field", head + "  - name: b\n    max_concurent: 2\n", `pgtraffic: rules line 4: budgets[1].max_concurent: unknown field (did you mean max_concurrent?)`},
		{"unknown field far from any", head + "    colour: red\n", `pgtraffic: rules line 3: budgets[0].colour: unknown field`},
		{"unknown field in JSON", "{\n \"budgets\": [\n  {\"name\": \"a\",\n   \"maxConcurrent\": 3}]}", `pgtraffic: rules line 4: budgets[0].maxConcurrent: unknown field (did you mean max_concurrent?)`},
		{"unknown rule field", head + "rules:\n  - budget: a\n    matches: {app: x}\n", "pgtraffic: rules line 4: rules[0].match: required: a rule must match at least one tag\n" +
			"pgtraffic: rules line 5: rules[0].matches: unknown field (did you mean match?)"},
		{"unknown guard", "guards:\n  require_where: enforce\n  block_drop: enforce\n", `pgtraffic: rules line 3: guards.block_drop: unknown field`},
		{"unknown guard field", "guards:\n  require_where: {mode: enforce, scope: {app: x}}\n", `pgtraffic: rules line 2: guards.require_where.scope: unknown field`},
		{"duplicate key", "server_cores: 2\nserver_cores: 3\n", `pgtraffic: rules line 2: server_cores: duplicate key (first on line 1)`},
		{"duplicate key through an alias", "a: &k server_cores\nbudgets: []\n*k : 2\nserver_cores: 3\n", "pgtraffic: rules line 1: a: unknown field\n" +
			"pgtraffic: rules line 4: server_cores: duplicate key (first on line 1)"},
		{"duplicate key in a large mapping", "health_queries:\n" + strings.Repeat("  q: select 1\n", 1) + largeMapping(20) + "  q: select 2\n",
			"pgtraffic: rules line 23: health_queries.q: duplicate key (first on line 2)"},
		{"duplicate JSON key", "{\"budgets\": [{\"name\": \"a\", \"name\": \"b\"}]}", `pgtraffic: rules line 1: budgets[0].name: duplicate key (first on line 1)`},
		{"merge key", "budgets:\n  - &b {name: a}\n  - <<: *b\n", `pgtraffic: rules line 3: budgets[1]["<<"]: merge keys are not supported` + "\n" +
			"pgtraffic: rules line 3: budgets[1].name: required"},
		{"budgets not a list", "budgets: {name: a}\n", `pgtraffic: rules line 1: budgets: expected a list, got a mapping`},
		{"list as string", head + "    per: [a, b]\n", `pgtraffic: rules line 3: budgets[0].per: expected a string, got a list`},
		{"cores not a number", "server_cores: eight\n", `pgtraffic: rules line 1: server_cores: expected a number, got "eight"`},
		{"quoted number", "server_cores: \"8\"\n", `pgtraffic: rules line 1: server_cores: expected a number, got "8"`},
		{"a malformed field is reported once", head + "    max_concurrent: lots\n    name2: x\n", "pgtraffic: rules line 3: budgets[0].max_concurrent: expected an integer, got \"lots\"\n" +
			"pgtraffic: rules line 4: budgets[0].name2: unknown field (did you mean name?)"},
		{"float concurrency", head + "    max_concurrent: 2.5\n", `pgtraffic: rules line 3: budgets[0].max_concurrent: expected an integer, got "2.5"`},
		{"duration without unit", head + "    per_query_limit: 2\n", `pgtraffic: rules line 3: budgets[0].per_query_limit: duration "2" has no unit (write e.g. 2s or 2ms)`},
		{"bad duration", head + "    max_wait: 2 seconds\n", `pgtraffic: rules line 3: budgets[0].max_wait: invalid duration "2 seconds" (write e.g. 250ms, 2s, 1m)`},
		{"negative duration", head + "    per_query_limit: -1s\n", `pgtraffic: rules line 3: budgets[0].per_query_limit: must not be negative, got -1s`},
		{"explicit zero limit", head + "    per_query_limit: 0s\n", `pgtraffic: rules line 3: budgets[0].per_query_limit: must be > 0 (omit it for the default), got 0`},
		{"zero cores", "server_cores: 0\n", `pgtraffic: rules line 1: server_cores: must be a number > 0, got 0`},
		{"negative cores", "server_cores: -2\n", `pgtraffic: rules line 1: server_cores: must be a number > 0, got -2`},
		{"infinite cores", "server_cores: .inf\n", `pgtraffic: rules line 1: server_cores: must be a number > 0, got +Inf`},
		{"health interval too short", "health_interval: 1ms\n", `pgtraffic: rules line 1: health_interval: must be at least 10ms, got 1ms`},
		{"health query name too long", "health_queries: {" + strings.Repeat("q", 129) + ": select 1}\n", `pgtraffic: rules line 1: health_queries["` + strings.Repeat("q", 32) + `"...]: a health query name of at most 128 characters, got 129`},
		{"health interval too long", "health_interval: 1000000h\n", `pgtraffic: rules line 1: health_interval: must be at most 24h0m0s, got 1000000h0m0s`},
		{"bad health query name", "health_queries:\n  \"my load\": select 1\n", `pgtraffic: rules line 2: health_queries["my load"]: a health query name needs letters, digits, '_' or '-' only`},
		{"empty health query", "health_queries:\n  load: \" \"\n", `pgtraffic: rules line 2: health_queries.load: empty query`},
		{"null health query", "health_queries:\n  load:\n", `pgtraffic: rules line 2: health_queries.load: expected a string, got null`},
		{"bad mode", head + "    mode: enfoce\n", `pgtraffic: rules line 3: budgets[0].mode: unknown mode "enfoce" (want enforce, warn or off)`},
		{"negative concurrency", head + "    max_concurrent: -1\n", `pgtraffic: rules line 3: budgets[0].max_concurrent: must be >= 0 (0 admits nothing; omit it for no limit), got -1`},
		{"negative max_queue", head + "    max_wait: 1s\n    max_queue: -1\n", `pgtraffic: rules line 4: budgets[0].max_queue: must be >= 0, got -1`},
		{"max_queue without max_wait", head + "    max_concurrent: 2\n    max_queue: 4\n", `pgtraffic: rules line 4: budgets[0].max_queue: has no effect without max_wait (only statements that may wait are queued)`},
		{"max_queue with a zero max_wait", head + "    max_wait: 0s\n    max_queue: 0\n", `pgtraffic: rules line 4: budgets[0].max_queue: has no effect without max_wait (only statements that may wait are queued)`},
		{"max_queue not a number", head + "    max_wait: 1s\n    max_queue: lots\n", `pgtraffic: rules line 4: budgets[0].max_queue: expected an integer, got "lots"`},
		{"float max_queue", head + "    max_wait: 1s\n    max_queue: 2.5\n", `pgtraffic: rules line 4: budgets[0].max_queue: expected an integer, got "2.5"`},
		{"max_queue as a list", head + "    max_wait: 1s\n    max_queue: [4]\n", `pgtraffic: rules line 4: budgets[0].max_queue: expected an integer, got a list`},
		{"max_queue past an int", head + "    max_wait: 1s\n    max_queue: 99999999999999999999\n", `pgtraffic: rules line 4: budgets[0].max_queue: expected an integer, got "99999999999999999999"`},
		{"negative max_queue in JSON", "{\"budgets\": [\n  {\"name\": \"a\", \"max_wait\": \"1s\",\n   \"max_queue\": -1}]}", `pgtraffic: rules line 3: budgets[0].max_queue: must be >= 0, got -1`},
		{"JSON max_queue without max_wait", "{\"budgets\": [\n  {\"name\": \"a\",\n   \"max_queue\": 4}]}", `pgtraffic: rules line 3: budgets[0].max_queue: has no effect without max_wait (only statements that may wait are queued)`},
		{"JSON max_queue as a string", "{\"budgets\": [\n  {\"name\": \"a\", \"max_wait\": \"1s\",\n   \"max_queue\": \"4\"}]}", `pgtraffic: rules line 3: budgets[0].max_queue: expected an integer, got "4"`},
		{"share above 1", head + "    server_share: 1.5\n", `pgtraffic: rules line 3: budgets[0].server_share: must be in [0, 1], got 1.5`},
		{"negative share", head + "    server_share: -0.5\n", `pgtraffic: rules line 3: budgets[0].server_share: must be in [0, 1], got -0.5`},
		{"share too small for a float", head + "    server_share: 1e-400\n", `pgtraffic: rules line 3: budgets[0].server_share: too small a number: it reads as 0 (write 0 if that is meant)`},
		{"share too small in JSON", `{"budgets": [{"name": "a", "server_share": 0.` + strings.Repeat("0", 400) + `1}]}`,
			`pgtraffic: rules line 1: budgets[0].server_share: too small a number: it reads as 0 (write 0 if that is meant)`},
		{"threshold too small", head + "    throttle_when: {in_flight: 1e-400}\n", `pgtraffic: rules line 3: budgets[0].throttle_when.in_flight: too small a number: it reads as 0 (write 0 if that is meant)`},
		{"burst with zero share", head + "    server_share: 0\n    burst_limit: 5s\n", `pgtraffic: rules line 4: budgets[0].burst_limit: needs server_share (the rate the bucket drains at)`},
		{"zero max_duration", head + "    max_duration: 0s\n", `pgtraffic: rules line 3: budgets[0].max_duration: must be > 0 (omit it for the default), got 0`},
		{"quarantine without a limit", head + "    quarantine: {after: 2, for: 30s}\n", `pgtraffic: rules line 3: budgets[0].quarantine: needs max_duration or per_query_limit (the overruns it counts)`},
		{"quarantine after 0", head + "    max_duration: 1s\n    quarantine: {after: 0, for: 30s}\n", `pgtraffic: rules line 4: budgets[0].quarantine.after: must be at least 1, got 0`},
		{"quarantine without for", head + "    max_duration: 1s\n    quarantine: {after: 2}\n", `pgtraffic: rules line 4: budgets[0].quarantine.for: must be a duration > 0, got 0s`},
		{"quarantine unknown field", head + "    max_duration: 1s\n    quarantine: {after: 2, for: 1s, fro: 1s}\n", `pgtraffic: rules line 4: budgets[0].quarantine.fro: unknown field (did you mean for?)`},
		{"bad until", head + "rules:\n  - budget: a\n    match: {app: x}\n    until: tomorrow\n", `pgtraffic: rules line 6: rules[0].until: invalid time "tomorrow" (write an RFC 3339 time such as 2026-12-02T10:00:00Z)`},
		{"until without zone", head + "rules:\n  - budget: a\n    match: {app: x}\n    until: 2026-12-02T10:00:00\n", `pgtraffic: rules line 6: rules[0].until: invalid time "2026-12-02T10:00:00" (write an RFC 3339 time such as 2026-12-02T10:00:00Z)`},
		{"burst without share", head + "    burst_limit: 5s\n", `pgtraffic: rules line 3: budgets[0].burst_limit: needs server_share (the rate the bucket drains at)`},
		{"threshold 1", head + "    warning_threshold: 1\n", `pgtraffic: rules line 3: budgets[0].warning_threshold: must be in (0, 1), got 1`},
		{"blank per", head + "    per: \" \"\n", `pgtraffic: rules line 3: budgets[0].per: must be a tag key, got " "`},
		{"bad explain", head + "    explain: always\n", `pgtraffic: rules line 3: budgets[0].explain: unknown value "always" (want auto, pattern or call)`},
		{"empty budget name", "budgets:\n  - mode: warn\n", `pgtraffic: rules line 2: budgets[0].name: required`},
		{"duplicate budget", head + "  - name: a\n", `pgtraffic: rules line 3: budgets[1].name: duplicate budget name "a" (also budgets[0])`},
		{"guard's name", "budgets:\n  - name: require_where\n", `pgtraffic: rules line 2: budgets[0].name: "require_where" is a guard's name, which its decisions are counted and logged by`},
		{"throttle unknown key", head + "    throttle_when: {cpu: 0.9}\n", `pgtraffic: rules line 3: budgets[0].throttle_when.cpu: unknown metric (want active_queries, replication_lag, in_flight or custom.<name>)`},
		{"throttle unknown custom", head + "    throttle_when:\n      custom.load: 3\n", `pgtraffic: rules line 4: budgets[0].throttle_when.custom.load: no health query named "load" in health_queries`},
		{"throttle negative", head + "    throttle_when: {active_queries: -1}\n", `pgtraffic: rules line 3: budgets[0].throttle_when.active_queries: must be a number >= 0, got -1`},
		{"throttle duration on a count", head + "    throttle_when: {active_queries: 5s}\n", `pgtraffic: rules line 3: budgets[0].throttle_when.active_queries: expected a number, got "5s"`},
		{"throttle bad lag", head + "    throttle_when: {replication_lag: soon}\n", `pgtraffic: rules line 3: budgets[0].throttle_when.replication_lag: invalid duration "soon" (write e.g. 250ms, 2s, 1m)`},
		{"rule unknown budget", head + "rules:\n  - budget: b\n    match: {app: x}\n", `pgtraffic: rules line 4: rules[0].budget: unknown budget "b"`},
		{"rule without budget", head + "rules:\n  - match: {app: x}\n", `pgtraffic: rules line 4: rules[0].budget: required`},
		{"rule without match", head + "rules:\n  - budget: a\n", `pgtraffic: rules line 4: rules[0].match: required: a rule must match at least one tag`},
		{"rule with empty match", head + "rules:\n  - budget: a\n    match: {}\n", `pgtraffic: rules line 5: rules[0].match: required: a rule must match at least one tag`},
		{"null match value", head + "rules:\n  - budget: a\n    match:\n      app:\n", `pgtraffic: rules line 6: rules[0].match.app: expected a string, got null`},
		{"empty match key", head + "rules:\n  - budget: a\n    match: {\"\": x}\n", `pgtraffic: rules line 5: rules[0].match[""]: empty tag key`},
		{"dotted digits before a slash are a CIDR", head + "rules:\n  - budget: a\n    match: {v: 1.2/beta}\n", `pgtraffic: rules line 5: rules[0].match.v: invalid CIDR prefix "1.2/beta"`},
		{"bad CIDR length", head + "rules:\n  - budget: a\n    match: {ip: 10.0.0.0/33}\n", `pgtraffic: rules line 5: rules[0].match.ip: invalid CIDR prefix "10.0.0.0/33"`},
		{"bad CIDR address", head + "rules:\n  - budget: a\n    match: {ip: 300.1.2.3/8}\n", `pgtraffic: rules line 5: rules[0].match.ip: invalid CIDR prefix "300.1.2.3/8"`},
		{"bad IPv6 CIDR", head + "rules:\n  - budget: a\n    match: {ip: \"2001:db8::/x\"}\n", `pgtraffic: rules line 5: rules[0].match.ip: invalid CIDR prefix "2001:db8::/x"`},
		{"guard bad mode", "guards:\n  require_where: always\n", `pgtraffic: rules line 2: guards.require_where.mode: unknown mode "always" (want enforce, warn or off)`},
		{"guard match without mode", "guards:\n  block_truncate:\n    match: {app: web}\n", `pgtraffic: rules line 2: guards.block_truncate.mode: required with match (a guard without a mode is off)`},
		{"guard list", "guards:\n  block_truncate: [enforce]\n", `pgtraffic: rules line 2: guards.block_truncate: expected a mode or a mapping {mode, match}, got a list`},
		{"guard bad CIDR", "guards:\n  block_truncate: {mode: enforce, match: {ip: 1.2.3.4/99}}\n", `pgtraffic: rules line 2: guards.block_truncate.match.ip: invalid CIDR prefix "1.2.3.4/99"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.in))
			if err == nil {
				t.Fatalf("Parse succeeded: %#v", cfg)
			}
			if cfg != nil {
				t.Errorf("Parse returned a config with its error")
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got: %s\nwant: %s", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("errors.Is(err, ErrInvalid) = false")
			}
			var e *Error
			if !errors.As(err, &e) || e.Line == 0 {
				t.Errorf("errors.As(*Error) = %v, line %d; want a line", e, lineOf(e))
			}
		})
	}
}

func lineOf(e *Error) int {
	if e == nil {
		return 0
	}
	return e.Line
}

// TestParseReportsAll checks that one pass reports every problem, by line.
func TestParseReportsAll(t *testing.T) {
	in := `budgets:
  - name: a
    mode: loud
    server_share: 2
  - name: a
rules:
  - budget: nope
    match: {ip: 10.0.0.1/40}
`
	_, err := Parse([]byte(in))
	want := []string{
		`pgtraffic: rules line 3: budgets[0].mode: unknown mode "loud" (want enforce, warn or off)`,
		`pgtraffic: rules line 4: budgets[0].server_share: must be in [0, 1], got 2`,
		`pgtraffic: rules line 5: budgets[1].name: duplicate budget name "a" (also budgets[0])`,
		`pgtraffic: rules line 7: rules[0].budget: unknown budget "nope"`,
		`pgtraffic: rules line 8: rules[0].match.ip: invalid CIDR prefix "10.0.0.1/40"`,
	}
	if err == nil || err.Error() != strings.Join(want, "\n") {
		t.Errorf("got:\n%v\nwant:\n%s", err, strings.Join(want, "\n"))
	}
}

func TestParseCapsErrors(t *testing.T) {
	var b strings.Builder
	b.WriteString("budgets:\n")
	for range maxErrors + 5 {
		b.WriteString("  - {name: x, mode: bad}\n")
	}
	_, err := Parse([]byte(b.String()))
	if err == nil {
		t.Fatal("no error")
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != maxErrors+1 || !strings.HasSuffix(lines[maxErrors], "more problems not shown") {
		t.Errorf("got %d lines, last %q; want %d and a summary", len(lines), lines[len(lines)-1], maxErrors+1)
	}
}

func TestDurationText(t *testing.T) {
	tests := []struct {
		in      string
		want    Duration
		wantErr string
	}{
		{"250ms", Duration(250 * time.Millisecond), ""},
		{"1m30s", Duration(90 * time.Second), ""},
		{"0", 0, ""},
		{"2", 0, `pgtraffic: duration "2" has no unit (write e.g. 2s or 2ms)`},
		{"1.5", 0, `pgtraffic: duration "1.5" has no unit (write e.g. 1.5s or 1.5ms)`},
		{"soon", 0, `pgtraffic: invalid duration "soon" (write e.g. 250ms, 2s, 1m)`},
		{".", 0, `pgtraffic: invalid duration "." (write e.g. 250ms, 2s, 1m)`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			var d Duration
			err := d.UnmarshalText([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || err.Error() != tt.wantErr {
					t.Fatalf("err = %v, want %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || d != tt.want {
				t.Fatalf("got %v, %v; want %v", d, err, tt.want)
			}
			text, _ := d.MarshalText()
			var back Duration
			if err := back.UnmarshalText(text); err != nil || back != d {
				t.Errorf("%s did not round-trip: %v, %v", text, back, err)
			}
		})
	}
}

// FuzzParse: Parse never panics, and whatever it accepts validates and survives a round
// trip through YAML and through JSON unchanged.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"testdata/full.yaml", "testdata/full.json"} {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{
		"{}", "", "server_cores: 2", "budgets: [{name: a, server_share: 0.1}]",
		"budgets: [{name: a}]\nrules: [{budget: a, match: {ip: \"::ffff:1.2.3.0/120\"}}]",
		"guards: {require_where: {mode: warn, match: {app: x}}}",
		"budgets: [{name: a, throttle_when: {replication_lag: 1m}}]",
		"budgets: [{name: a, max_concurrent: 2, max_wait: 1s, max_queue: 0}, {name: b, max_wait: 1s}]",
		"a: &a [*a]", "budgets: &b [*b]", "{\"budgets\": [{\"name\": \"\\u0000\"}]}",
		"{\"budgets\": []}\n}", "{}{}", "budgets:\n  - name: a\xff\n", "server_cores: 1\n\x00", "\xef\xbb\xbf{}",
		"coordination: {redis: \"redis://:pw@h:1/0\", sync_interval: 1s, fallback_instances: 3}\nbudgets: [{name: a, shared: false}]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse(data)
		if err != nil {
			if cfg != nil {
				t.Fatal("config returned with an error")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			// Every problem in a file names its line, so that it can be found.
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, "pgtraffic: rules line ") && !strings.HasSuffix(line, "more problems not shown") {
					t.Fatalf("a problem without a line: %q", line)
				}
			}
			return
		}
		if err := cfg.Validate(); err != nil {
			t.Fatalf("Parse accepted what Validate rejects: %v", err)
		}
		for _, marshal := range []func(any) ([]byte, error){yaml.Marshal, json.Marshal} {
			out, err := marshal(cfg)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			back, err := Parse(out)
			if err != nil {
				t.Fatalf("re-parse of\n%s\nfailed: %v", out, err)
			}
			if !reflect.DeepEqual(back, cfg) {
				t.Fatalf("round trip changed the config:\n%s\ngot  %#v\nwant %#v", out, back, cfg)
			}
		}
	})
}

// largeMapping writes n distinct health queries, indented as health_queries' entries.
func largeMapping(n int) string {
	var sb strings.Builder
	for i := range n {
		sb.WriteString("  q" + strconv.Itoa(i) + ": select 1\n")
	}
	return sb.String()
}

// TestZeroWrittenAnyWay: a zero written in any form is 0 (server_share: 0 closes the budget on
// purpose); only a number that is not zero but too small for a float64 is refused.
func TestZeroWrittenAnyWay(t *testing.T) {
	for _, zero := range []string{"0", "0.0", "-0.0", "0.000", "0e-5", "0E10", "0.0e-400"} {
		cfg, err := Parse([]byte("budgets: [{name: a, server_share: " + zero + "}]"))
		if err != nil {
			t.Errorf("server_share: %s: %v", zero, err)
			continue
		}
		if s := cfg.Budgets[0].ServerShare; s == nil || *s != 0 {
			t.Errorf("server_share: %s reads as %v, want 0", zero, s)
		}
	}
}
