package coord

import (
	"fmt"
	"maps"
	"net/url"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// clientFor returns a client for the coordination section's redis:// or rediss:// URL, set
// up for syncs: context deadlines honoured, no retries (the loop retries on its own
// schedule) and dial timeouts within a sync's deadline. Its errors never contain the URL's
// credentials nor its options' values, and name the option at fault.
func clientFor(rawURL string, interval time.Duration) (*redis.Client, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		// go-redis may quote the URL or an option's value: say which URL without its
		// credentials and query, and which option.
		return nil, fmt.Errorf("coord: invalid Redis URL %s%s", rules.RedactURL(rawURL), optionAtFault(rawURL))
	}
	if interval <= 0 {
		interval = rules.DefaultSyncInterval
	}
	d := callDeadline(interval)
	opts.ContextTimeoutEnabled = true
	opts.MaxRetries = -1
	opts.DialTimeout = d
	opts.ReadTimeout = d
	opts.WriteTimeout = d
	opts.DialerRetries = 1
	// A new connection's handshake runs within the call's deadline: leave out the round trips
	// a coordinator has no use for (CLIENT SETINFO, CLIENT MAINT_NOTIFICATIONS), so that a
	// call after a reconnect is HELLO, EVALSHA and, once Redis lost the script, EVAL.
	opts.DisableIdentity = true
	opts.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	opts.PoolSize = maxCalls // an abandoned call keeps its place among them until it drains
	return redis.NewClient(opts), nil
}

// optionAtFault says which client option of rawURL's query go-redis refuses, and whether for
// its name or its value, without the value (an option's value may be a secret); "" when the URL
// is at fault without its query. go-redis itself judges each option, alone on the URL stripped
// of its credentials: with an empty value, which it takes for any option it reads, then with
// the URL's. A name that go-redis does not read is shown only if it looks like an option's
// (see optionName): otherwise it may be the rest of a password whose '?' was written as is.
func optionAtFault(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return ""
	}
	probe := *u
	probe.User = nil
	refused := func(q url.Values) bool {
		probe.RawQuery = q.Encode()
		_, err := redis.ParseURL(probe.String())
		return err != nil
	}
	if refused(nil) {
		return ""
	}
	q := u.Query()
	names := slices.Sorted(maps.Keys(q))
	for _, name := range names {
		switch {
		case refused(url.Values{name: {""}}):
			if !optionName(name) {
				return ": its query has an option go-redis does not read (the name is not shown: it may be part of a password)"
			}
			return fmt.Sprintf(": go-redis reads no option %q in a %s:// URL", name, u.Scheme)
		case refused(url.Values{name: q[name]}):
			return fmt.Sprintf(": option %q has an invalid value (the value is not shown)", name)
		}
	}
	return ""
}

// maxOptionName bounds the name of an option optionAtFault shows: go-redis's longest is 26
// bytes (pipeline_write_buffer_size).
const maxOptionName = 32

// optionName reports whether name looks like a client option's name, misspelt or not: short,
// of ASCII letters, digits, '_' and '-'. A password's '@', ':', '/' or any other character
// makes it one not to show.
func optionName(name string) bool {
	if name == "" || len(name) > maxOptionName {
		return false
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}
