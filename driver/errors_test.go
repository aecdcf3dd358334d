package driver_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgtraffic/pgtraffic/driver"
)

// A blocked statement was never sent, so pgx's retry test, and helpers built on it, may retry it,
// also when it is wrapped.
func TestBlockedErrorSafeToRetry(t *testing.T) {
	blocked := &driver.BlockedError{Budget: "reporting", Rule: "app=reporting", Reason: driver.ReasonConcurrency,
		Fingerprint: "a1b2", Limit: "max_concurrent=4", RetryAfter: 50 * time.Millisecond}
	for name, err := range map[string]error{
		"bare":    blocked,
		"wrapped": fmt.Errorf("load report: %w", blocked),
	} {
		t.Run(name, func(t *testing.T) {
			if !pgconn.SafeToRetry(err) {
				t.Errorf("pgconn.SafeToRetry(%v) = false, want true", err)
			}
			if !errors.Is(err, driver.ErrBlocked) {
				t.Errorf("errors.Is(%v, ErrBlocked) = false", err)
			}
		})
	}
	if pgconn.SafeToRetry(errors.New("pgtraffic: something else")) {
		t.Error("pgconn.SafeToRetry of a plain error = true; the check above proves nothing")
	}
}

// TestBlockedErrorWithoutFingerprint: a refusal of Connector.Check or Pool.Check names no
// statement, and its message says nothing of a fingerprint rather than "fingerprint )".
func TestBlockedErrorWithoutFingerprint(t *testing.T) {
	err := &driver.BlockedError{Budget: "batch", Rule: "app=batch", Reason: driver.ReasonConcurrency,
		Limit: "max_concurrent=0"}
	want := `pgtraffic: statement blocked by budget "batch" (reason concurrency, max_concurrent=0)`
	if got := err.Error(); got != want {
		t.Errorf("message %q, want %q", got, want)
	}
	err.Fingerprint = "a1b2"
	if got := err.Error(); got != `pgtraffic: statement blocked by budget "batch" (reason concurrency, max_concurrent=0, fingerprint a1b2)` {
		t.Errorf("with a fingerprint: %q", got)
	}
}
