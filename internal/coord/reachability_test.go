package coord

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

// redisRefusal is an error Redis replied with, as go-redis reports one (redis.Error).
type redisRefusal string

func (r redisRefusal) Error() string { return string(r) }
func (redisRefusal) RedisError()     {}

// TestRefusalIsNotUnreachable: a sync that Redis answered with an error (an ACL without
// EVALSHA, maxmemory with noeviction) is logged as Redis refusing the calls, pointing an
// operator at Redis's configuration, not at the network; a sync that got no answer is logged
// as Redis unreachable.
func TestRefusalIsNotUnreachable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("coord: sync: %w", redisRefusal("NOPERM this user has no permissions to run the 'evalsha' command")), "Redis refused the coordination calls"},
		{fmt.Errorf("coord: sync: %w", redisRefusal("OOM command not allowed when used memory > 'maxmemory'")), "Redis refused the coordination calls"},
		{fmt.Errorf("coord: sync: dial tcp 127.0.0.1:1: connect: connection refused"), "Redis unreachable"},
	} {
		var buf bytes.Buffer
		c := &Coordinator{log: slog.New(slog.NewTextHandler(&buf, nil)), id: "i"}
		c.logReachability(tc.err)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%v logged %q; want %q", tc.err, buf.String(), tc.want)
		}
	}
}
