package coord

import (
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"
)

// fuzzShownName is the option name optionAtFault quotes, if any.
var fuzzShownName = regexp.MustCompile(`option "((?:[^"\\]|\\.)*)"`)

// FuzzOptionAtFault: whatever the URL, optionAtFault never shows a password nor an option's
// value (each starts with a marker that nothing else in the URL holds), shows only a name that
// looks like an option's, stays short, and names a fault only in a URL that go-redis refuses.
func FuzzOptionAtFault(f *testing.F) {
	for _, s := range []struct{ raw, name, value, secret string }{
		{"h:6379/0", "dial_timeout", "2s", "pw"},
		{"h:6379/0", "dial_timeout", "nonsense", "pw"},
		{"h:6379/0", "dial_timout", "2s", "pw"},
		{"h/0?skip_verify=true", "", "", "pw"},
		{"h/0?db=1&db=x", "protocol", "-1", "p?w&x=y"},
		{"h/0?idle_timeout=1s&conn_max_idle_time=1s", "", "", "pw"},
		{"h/0?a@b=1", "pool_fifo", "maybe", "pw/x@y"},
		{"[::1]:1/0?%zz", "x", "y", "%"},
		{"h:notaport/0", "read_timeout", "1", "pw"},
		{"/tmp/redis.sock?db=2", "client_name", "a b", "pw"},
		{"h/0?" + strings.Repeat("a", 40) + "=1", "", "", "pw"},
		{"h/0?\xff=1", "\xfe", "\xfd", "\x00"},
	} {
		f.Add(s.raw, s.name, s.value, s.secret)
	}
	f.Fuzz(func(t *testing.T, raw, name, value, secret string) {
		const pwMark, valueMark = "Zq9", "Vx7"
		query := url.Values{name: {valueMark + value}}.Encode()
		user := url.UserPassword("u", pwMark+secret).String()
		for _, in := range []string{
			raw,
			"redis://" + raw,
			"rediss://" + user + "@" + raw + "&" + query,
			"rediss://" + user + "@" + raw + "?" + query,
			"unix://" + user + "@" + raw + "?" + query,
			// A password written as is, '?' and '/' and all: what follows a '?' in it is
			// read as the query.
			"redis://u:6379" + secret + "@" + raw + "?" + query,
		} {
			got := optionAtFault(in)
			if got == "" {
				continue
			}
			if len(got) > 200 || !utf8.ValidString(got) {
				t.Fatalf("optionAtFault(%q) = %q: too long or invalid UTF-8", in, got)
			}
			u, err := url.Parse(in)
			if err != nil {
				t.Fatalf("optionAtFault(%q) = %q for no URL", in, got)
			}
			if _, err := redis.ParseURL(in); err == nil {
				t.Fatalf("optionAtFault(%q) = %q for a URL go-redis takes", in, got)
			}
			// What may be shown: the scheme and the query's names. A marker in neither
			// must not be.
			var names []string
			for n := range u.Query() {
				names = append(names, n)
			}
			shown := u.Scheme + " " + strings.Join(names, " ")
			for _, mark := range []string{pwMark, valueMark} {
				if strings.Contains(got, mark) && !strings.Contains(shown, mark) {
					t.Fatalf("optionAtFault(%q) = %q shows a password or a value", in, got)
				}
			}
			if m := fuzzShownName.FindStringSubmatch(got); m != nil {
				n, err := strconv.Unquote(`"` + m[1] + `"`)
				if err != nil || !optionName(n) {
					t.Fatalf("optionAtFault(%q) = %q shows a name that is not an option's", in, got)
				}
			}
		}
	})
}
