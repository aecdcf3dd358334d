package coord

import (
	"context"
	"os"
	"testing"

	"github.com/redis/go-redis/v9"
)

// quietRedis drops go-redis's own log lines ("failed to dial"), which the tests that stop
// Redis provoke on purpose.
type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quietRedis{})
	os.Exit(m.Run())
}

// newCoord is New for a test, which fails on an error.
func newCoord(tb testing.TB, o Options) *Coordinator {
	tb.Helper()
	c, err := New(o)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
