package coord

import (
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/pgtraffic/pgtraffic/driver/rules"
)

// clientFor returns a client for the coordination section's redis:// or rediss:// URL, set
// up for syncs: context deadlines honoured, no retries (the loop retries on its own
// schedule) and dial timeouts within a sync's deadline. Its errors never contain the URL's
// credentials.
func clientFor(rawURL string, interval time.Duration) (*redis.Client, error) {
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		// go-redis may quote the URL; say which one without its credentials.
		return nil, fmt.Errorf("coord: invalid Redis URL %s", rules.RedactURL(rawURL))
	}
	if interval <= 0 {
		interval = rules.DefaultSyncInterval
	}
	d := max(interval/4, minDeadline)
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
