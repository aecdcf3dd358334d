package rules

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseCoordination(t *testing.T) {
	cfg, err := Parse([]byte(`
coordination:
  redis: rediss://app:s3cret@redis.internal:6380/2
  sync_interval: 500ms
  fallback_instances: 40
budgets:
  - name: reporting
    server_share: 0.25
  - name: local
    shared: false
`))
	if err != nil {
		t.Fatal(err)
	}
	co := cfg.Coordination
	if co == nil || co.Redis != "rediss://app:s3cret@redis.internal:6380/2" || co.SyncInterval != Duration(500*time.Millisecond) || co.FallbackInstances != 40 {
		t.Fatalf("coordination: %v", co)
	}
	if !cfg.IsShared(&cfg.Budgets[0]) || cfg.IsShared(&cfg.Budgets[1]) {
		t.Fatalf("shared: reporting %v (want the default, true), local %v (want false)", cfg.Budgets[0].Shared, *cfg.Budgets[1].Shared)
	}
}

func TestCoordinationDefaults(t *testing.T) {
	cfg, err := Parse([]byte("coordination: {redis: redis://127.0.0.1:6379}\nbudgets: [{name: a}]"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Coordination.SyncInterval != Duration(time.Second) || cfg.Coordination.FallbackInstances != 10 {
		t.Fatalf("defaults: %v, fallback %d", cfg.Coordination, cfg.Coordination.FallbackInstances)
	}
	// shared follows the section: Parse leaves it omitted (so that the section may be removed
	// in code), IsShared reads it as true, and WithDefaults shows it.
	if s := cfg.Budgets[0].Shared; s != nil || !cfg.IsShared(&cfg.Budgets[0]) {
		t.Fatalf("shared %v, IsShared %v: want omitted, and shared by default once coordination is set", s, cfg.IsShared(&cfg.Budgets[0]))
	}
	if s := cfg.WithDefaults().Budgets[0].Shared; s == nil || !*s {
		t.Fatal("WithDefaults: a budget is shared by default once coordination is set")
	}

	// An empty section coordinates through a client given in code.
	cfg, err = Parse([]byte("coordination: {}\nbudgets: [{name: a}]"))
	if err != nil || cfg.Coordination == nil || !cfg.IsShared(&cfg.Budgets[0]) {
		t.Fatalf("coordination: {} → %v, %v", cfg, err)
	}

	// Without the section nothing is shared and no default appears.
	cfg, err = Parse([]byte("budgets: [{name: a}]"))
	if err != nil || cfg.Coordination != nil || cfg.Budgets[0].Shared != nil || cfg.IsShared(&cfg.Budgets[0]) {
		t.Fatalf("no coordination → %+v, %v", cfg.Budgets, err)
	}
}

func TestCoordinationErrors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		want       string // the error, whole
	}{
		{"scheme", "coordination:\n  redis: http://u:pw@h:6379\n",
			`pgtraffic: rules line 2: coordination.redis: must be a redis://, rediss:// or unix:// URL (the value is not shown: it may hold a password)`},
		{"no host", "coordination:\n  redis: redis:///0\n",
			`pgtraffic: rules line 2: coordination.redis: has no host (the value is not shown: it may hold a password)`},
		{"bad port", "coordination:\n  redis: redis://:pw@h:70000/0\n",
			`pgtraffic: rules line 2: coordination.redis: has an invalid port (the value is not shown: it may hold a password)`},
		{"bad database", "coordination:\n  redis: redis://:pw@h/x\n",
			`pgtraffic: rules line 2: coordination.redis: has an invalid database number (want /0, /1, ...) (the value is not shown: it may hold a password)`},
		{"long path", "coordination:\n  redis: redis://:pw@h/0/pw\n",
			`pgtraffic: rules line 2: coordination.redis: has a path of more than a database number (the value is not shown: it may hold a password)`},
		{"bad db option", "coordination:\n  redis: redis://h/0?db=pw\n",
			`pgtraffic: rules line 2: coordination.redis: has an invalid db option (want a number) (the value is not shown: it may hold a password)`},
		{"a '#' in the password", "coordination:\n  redis: redis://:p@ss#word@h:6379/0\n",
			`pgtraffic: rules line 2: coordination.redis: has a '#' (write one in a password as %23) (the value is not shown: it may hold a password)`},
		{"unix without a path", "coordination:\n  redis: unix://:pw@\n",
			`pgtraffic: rules line 2: coordination.redis: has no socket path (the value is not shown: it may hold a password)`},
		{"interval too short", "coordination:\n  sync_interval: 10ms\n",
			`pgtraffic: rules line 2: coordination.sync_interval: must be between 100ms and 1m0s, got 10ms`},
		{"interval too long", "coordination:\n  sync_interval: 2m\n",
			`pgtraffic: rules line 2: coordination.sync_interval: must be between 100ms and 1m0s, got 2m0s`},
		{"interval not a duration", "coordination:\n  sync_interval: redis://u:pw@h\n",
			`pgtraffic: rules line 2: coordination.sync_interval: expected a duration such as 1s`},
		{"zero interval", "coordination:\n  sync_interval: 0s\n",
			`pgtraffic: rules line 2: coordination.sync_interval: must be > 0 (omit it for the default), got 0`},
		{"fallback zero", "coordination:\n  fallback_instances: 0\n",
			`pgtraffic: rules line 2: coordination.fallback_instances: must be > 0 (omit it for the default), got 0`},
		{"fallback not an integer", "coordination:\n  fallback_instances: pw\n",
			`pgtraffic: rules line 2: coordination.fallback_instances: expected an integer`},
		{"unknown field", "coordination:\n  sync_intervall: 1s\n",
			`pgtraffic: rules line 2: coordination.sync_intervall: unknown field (did you mean sync_interval?)`},
		{"shared without coordination", "budgets:\n  - name: a\n    shared: true\n",
			`pgtraffic: rules line 3: budgets[0].shared: needs a coordination section (where the instances share it)`},
		{"shared not a boolean", "coordination: {}\nbudgets:\n  - name: a\n    shared: yes please\n",
			`pgtraffic: rules line 4: budgets[0].shared: expected true or false, got "yes please"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("%v does not wrap ErrInvalid", err)
			}
			if err.Error() != tc.want {
				t.Fatalf("got  %s\nwant %s", err, tc.want)
			}
			if strings.Contains(err.Error(), "pw") {
				t.Fatalf("the error shows a credential: %s", err)
			}
		})
	}
}

func TestValidateCoordinationInCode(t *testing.T) {
	yes := true
	cfg := &Config{Budgets: []Budget{{Name: "a", Shared: &yes}}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "budgets[0].shared: needs a coordination section") {
		t.Fatalf("shared without coordination: %v", err)
	}
	cfg.Coordination = &Coordination{Redis: "redis://127.0.0.1:6379/0", SyncInterval: Duration(time.Second)}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestCloneCoversCoordination(t *testing.T) {
	no := false
	cfg := &Config{Coordination: &Coordination{Redis: "redis://h"}, Budgets: []Budget{{Name: "a", Shared: &no}}}
	c := cfg.Clone()
	c.Coordination.Redis = "redis://other"
	*c.Budgets[0].Shared = true
	if cfg.Coordination.Redis != "redis://h" || *cfg.Budgets[0].Shared {
		t.Fatal("Clone shares the coordination section or a shared flag")
	}
	if d := cfg.Clone(); !reflect.DeepEqual(d, cfg) {
		t.Fatal("a clone differs from the original")
	}
}

// TestErrorsNeverShowSecrets: a password or a Redis URL written where it does not belong, or a
// file of secrets read as the rules file, is never quoted by the parse error.
func TestErrorsNeverShowSecrets(t *testing.T) {
	const secret = "hunter2secret"
	for _, tc := range []struct{ name, file string }{
		{"bare password as redis", "coordination:\n  redis: " + secret + "\n"},
		{"password in a non-URL redis", "coordination:\n  redis: \"" + secret + " x\"\n"},
		{"redis key forgotten", "coordination: redis://:" + secret + "@h:6379/0\n"},
		{"bare password as coordination", "coordination: " + secret + "\n"},
		{"redis as a list", "coordination:\n  redis: [" + secret + "]\n"},
		{"password as a key of coordination", "coordination: {" + secret + "}\n"},
		{"URL as a key of coordination", "coordination: {redis://:" + secret + "@h:6379/0}\n"},
		{"URL as sync_interval", "coordination:\n  sync_interval: redis://:" + secret + "@h\n"},
		{"password as fallback_instances", "coordination:\n  fallback_instances: " + secret + "\n"},
		{"URL as max_wait", "budgets:\n  - name: a\n    max_wait: redis://:" + secret + "@h:6379/0\n"},
		{"URL as server_cores", "server_cores: redis://default:" + secret + "@h:6379\n"},
		{"URL as a budget name", "budgets: [{name: a}]\nrules: [{budget: \"redis://:" + secret + "@h\", match: {app: x}}]\n"},
		{"URL as a top-level key", "budgets: []\nredis://:" + secret + "@h:6379/0: x\n"},
		{".env file", "REDIS_URL=redis://:" + secret + "@h:6379/0\nPGPASSWORD=" + secret + "\n"},
		{".env file with colons", "REDIS_PASSWORD: " + secret + "\nREDIS_HOST: h\n"},
		{"password file", "root:$6$" + secret + ":19000:0:99999:7:::\n"},
		{"JSON of secrets", "{\"password\": \"" + secret + "\"}"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.file))
			if err == nil {
				t.Fatal("accepted")
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("the error shows the secret: %s", err)
			}
		})
	}
	co := Coordination{Redis: secret}
	if out := fmt.Sprintf("%v %s", co, co.Redacted()); strings.Contains(out, secret) {
		t.Fatalf("a bare password as the URL is printed: %s", out)
	}
}

// The URLs the rules accept are the URLs go-redis reads (for URLs without client options,
// which go-redis alone checks), and the shapes they refuse go-redis refuses or reads as
// something else than was meant.
func TestRedisURLAsGoRedisReadsIt(t *testing.T) {
	for _, tc := range []struct {
		url string
		ok  bool
	}{
		{"redis://h", true},
		{"redis://127.0.0.1:6379/0", true},
		{"rediss://user:pw@redis.internal:6380/2", true},
		{"redis://[::1]:6379/15", true},
		{"redis://h/0?db=3", true},
		{"unix:///run/redis.sock", true},
		{"unix://:pw@/run/redis.sock?db=1", true},
		{"redis://h/x", false},
		{"redis://h/0/1", false},
		{"redis://h/0?db=x", false},
		{"http://h", false},
		{"unix://", false},
		{"redis://:p@ss#word@h:6379/0", false}, // url.Parse reads host "ss"
		{"redis://:p%40ss%23word@h:6379/0", true},
		// A '?' or '/' in a password written as is: its first part is read as host and port.
		{"redis://default:2024?Blue-Otter@h:6379/0", false},
		{"redis://default:2024?Blue=Otter@h:6379/0", false},
		{"redis://default:2024/Blue@h:6379/0", false},
		{"redis://u:p@ss?word@h:6379/0", false}, // url.Parse reads host "ss"
		{"unix://:20/24@/run/redis.sock", false},
		{"redis://default:2024%3FBlue-Otter@h:6379/0", true},
		{"redis://h/0?client_name=me@app", false}, // an '@' after the host is written %40
		{"redis://h/0?client_name=me%40app", true},
		{"redis://h/0?idle_timeout=1s", true},
		{"redis://h/0?idle_timeout=1s&conn_max_idle_time=1s", false}, // one option, two names
		{"redis://h/0?max_conn_age=1s&conn_max_lifetime=1s", false},
	} {
		problem := redisURLProblem(tc.url)
		if (problem == "") != tc.ok {
			t.Errorf("%s: problem %q, want ok=%v", tc.url, problem, tc.ok)
		}
		if _, err := redis.ParseURL(tc.url); tc.ok && err != nil {
			t.Errorf("%s: accepted, but go-redis refuses it: %v", tc.url, err)
		}
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"},
		{"redis://:pw@h:6379/0", "redis://xxxxx@h:6379/0"},
		{"rediss://user:pw@h/1", "rediss://xxxxx@h/1"},
		{"redis://token@h", "redis://xxxxx@h"},
		{"redis://h/0?password=pw", "redis://h/0?xxxxx"},
		{"redis://h#pw", "redis://h"},
		{"pw", "xxxxx (not a URL)"}, // a bare word may be nothing but a password
		{"redis://u:p w@h:bad port", "xxxxx (not a URL)"},
		// An '@' after the host: the host and the query may be parts of a password.
		{"redis://default:2024?Blue-Otter@h:6379/0", "xxxxx (not a URL)"},
		{"redis://default:2024/Blue@h:6379/0", "xxxxx (not a URL)"},
		{"redis://:2024#Blue@h:6379/0", "xxxxx (not a URL)"},
		{"redis://u:p@ss?word@h:6379/0", "xxxxx (not a URL)"},
		{"redis://h/0?client_name=me%40app", "redis://h/0?xxxxx"},
	} {
		if got := RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestCoordinationNeverPrintsCredentials(t *testing.T) {
	co := Coordination{Redis: "redis://admin:hunter2@h:6379/0?password=hunter3", SyncInterval: Duration(time.Second)}
	var logged bytes.Buffer
	slog.New(slog.NewTextHandler(&logged, nil)).Info("config", "coordination", co)
	for _, out := range []string{
		fmt.Sprint(co), fmt.Sprintf("%v %+v %#v %s", co, co, co, co), fmt.Sprint(&co), co.Redacted(), logged.String(),
	} {
		if strings.Contains(out, "hunter") || strings.Contains(out, "admin") {
			t.Fatalf("printed a credential: %s", out)
		}
		if !strings.Contains(out, "h:6379") {
			t.Fatalf("printed too little to recognise the server: %s", out)
		}
	}
}

func FuzzRedactURL(f *testing.F) {
	for _, s := range []string{"redis://:pw@h:6379/0", "rediss://user:pw@h/1?x=y", "redis://h", "%", "redis://[::1]:1", "pw@h#x"} {
		f.Add(s, "secret1")
	}
	f.Fuzz(func(t *testing.T, raw, secret string) {
		for _, in := range []string{raw, "redis://" + raw, "redis://u:Zq9" + url.QueryEscape(secret) + "@" + raw} {
			red := RedactURL(in)
			if red == "" || red == "xxxxx (not a URL)" {
				continue
			}
			// Whatever came in, what goes out holds no user information but "xxxxx", no
			// query but "xxxxx" and no fragment.
			u, err := url.Parse(red)
			if err != nil {
				t.Fatalf("RedactURL(%q) = %q does not parse: %v", in, red, err)
			}
			if _, hasPassword := u.User.Password(); u.User != nil && (u.User.Username() != "xxxxx" || hasPassword) {
				t.Fatalf("RedactURL(%q) = %q keeps user information", in, red)
			}
			if u.RawQuery != "" && u.RawQuery != "xxxxx" || u.Fragment != "" {
				t.Fatalf("RedactURL(%q) = %q keeps a query or fragment", in, red)
			}
			// The validation message never shows the password: it starts with a marker
			// that nothing else in the URL holds.
			if strings.Contains(in, "u:Zq9") && !strings.Contains(raw, "Zq9") {
				if problem := redisURLProblem(in); strings.Contains(problem, "Zq9") {
					t.Fatalf("the problem with %q shows the password: %s", in, problem)
				}
			}
		}
		// Nor does a password written as is, whatever it holds ('?', '/', '#', '@'): not its
		// first part, which a URL cut short reads as its host (a marker nothing in raw spells
		// out, even percent-encoded).
		if !strings.Contains(raw, "Zq9") && !strings.Contains(raw, "%") {
			in := "redis://Zq9" + secret + "@" + raw
			if red := RedactURL(in); strings.Contains(red, "Zq9") {
				t.Fatalf("RedactURL(%q) = %q shows the password", in, red)
			}
			if problem := redisURLProblem(in); strings.Contains(problem, "Zq9") {
				t.Fatalf("the problem with %q shows the password: %s", in, problem)
			}
		}
	})
}
