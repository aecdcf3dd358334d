package rules

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestRedisURLOptionErrors: a client option of the coordination URL that go-redis would refuse
// when the connector makes its client is refused by the rules, with the line, naming the option
// and never its value: a value of another kind, a misspelt name, skip_verify without TLS.
func TestRedisURLOptionErrors(t *testing.T) {
	const tail = " (the value is not shown: it may hold a password)"
	for _, tc := range []struct{ name, url, want string }{
		{"a duration", "redis://:pw@h:6379/0?dial_timeout=pwnonsense", "has an invalid dial_timeout option (want a duration such as 2s, or a number of seconds)"},
		{"an integer", "rediss://:pw@h:6379/0?max_retries=pwlots", "has an invalid max_retries option (want an integer)"},
		{"a boolean", "redis://:pw@h/0?pool_fifo=pwyes", "has an invalid pool_fifo option (want true, false, 1 or 0)"},
		{"the last value counts", "redis://h/0?pool_size=8&pool_size=pw", "has an invalid pool_size option (want an integer)"},
		{"misspelt", "redis://:pw@h:6379/0?pool_size=8&readTimeout=2s", "has an option readTimeout that go-redis does not read (did you mean read_timeout?)"},
		{"misspelt, no value", "redis://h/0?dial_timout", "has an option dial_timout that go-redis does not read (did you mean dial_timeout?)"},
		{"skip_verify without TLS", "redis://h/0?skip_verify=true", "has a skip_verify option, which only a rediss:// URL takes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(fmt.Sprintf("coordination:\n  redis: %q\n", tc.url)))
			want := "pgtraffic: rules line 2: coordination.redis: " + tc.want + tail
			if err == nil || !errors.Is(err, ErrInvalid) || err.Error() != want {
				t.Fatalf("got  %v\nwant %s", err, want)
			}
			if strings.Contains(err.Error(), "pw") {
				t.Fatalf("the error shows a value or a password: %s", err)
			}
			if _, err := redis.ParseURL(tc.url); err == nil {
				t.Fatalf("go-redis reads %s: the rules must not refuse it", tc.url)
			}
		})
	}
}

// TestRedisURLOptionsAsGoRedisReadsThem: each option the rules know is one that go-redis reads,
// of the kind they say: go-redis takes a value of its kind, and refuses one of another, as the
// rules do; an option neither knows is left to go-redis (the connector's error names it).
func TestRedisURLOptionsAsGoRedisReadsThem(t *testing.T) {
	good := map[optionKind]string{optInt: "3", optDatabase: "2", optDuration: "1500ms", optBool: "true", optString: "app"}
	bad := map[optionKind]string{optInt: "x", optDatabase: "x", optDuration: "soon", optBool: "yes"}
	for _, name := range slices.Sorted(maps.Keys(goRedisOptions)) {
		kind := goRedisOptions[name]
		for _, v := range []string{good[kind], "", "7"} {
			if kind == optBool && v == "7" {
				continue
			}
			u := "rediss://h/0?" + name + "=" + v
			if p := redisURLProblem(u); p != "" {
				t.Errorf("%s: refused: %s", u, p)
			}
			if _, err := redis.ParseURL(u); err != nil {
				t.Errorf("%s: accepted by the rules, refused by go-redis: %v", u, err)
			}
		}
		if v, ok := bad[kind]; ok {
			u := "rediss://h/0?" + name + "=" + v
			if p := redisURLProblem(u); p == "" {
				t.Errorf("%s: accepted by the rules", u)
			}
			if _, err := redis.ParseURL(u); err == nil {
				t.Errorf("%s: refused by the rules, accepted by go-redis", u)
			}
		}
	}
	if p := redisURLProblem("redis://h/0?unheard_of_option=1"); p != "" {
		t.Errorf("an option far from any known one: %s, want it left to go-redis", p)
	}
}

// FuzzRedisURLOptions: for any value of any option the rules know, the rules accept the URL
// exactly when go-redis does (a negative db aside, which the rules refuse as no database), and
// their problem never shows the value.
func FuzzRedisURLOptions(f *testing.F) {
	f.Add(uint8(0), "2s")
	f.Add(uint8(3), "nonsense")
	f.Add(uint8(7), "-1")
	f.Add(uint8(11), "true")
	names := slices.Sorted(maps.Keys(goRedisOptions))
	f.Fuzz(func(t *testing.T, i uint8, v string) {
		name := names[int(i)%len(names)]
		u := "rediss://h:6379/0?" + url.Values{name: {"Zq9" + v}}.Encode()
		problem := redisURLProblem(u)
		if strings.Contains(problem, "Zq9") {
			t.Fatalf("%s: the problem shows the value: %s", u, problem)
		}
		u = "rediss://h:6379/0?" + url.Values{name: {v}}.Encode()
		problem = redisURLProblem(u)
		_, err := redis.ParseURL(u)
		if problem == "" && err != nil || problem != "" && err == nil && name != "db" {
			t.Fatalf("%s: the rules say %q, go-redis %v", u, problem, err)
		}
	})
}
