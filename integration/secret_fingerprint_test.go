package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/driver"
	"github.com/pgtraffic/pgtraffic/internal/pattern"
	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSecretFingerprintHidesPassword: a blocked ALTER ROLE ... PASSWORD (never sent) has its
// fingerprint in the BlockedError text, the span, the warning log and the status page.
// pg_query's own fingerprint hashes the password (a String node, not a constant), so trying
// each candidate PIN against it would recover the password from any of those channels; the
// fingerprint of a utility statement is its tokens', values by their kind alone.
func TestSecretFingerprintHidesPassword(t *testing.T) {
	s := newTelSetup(t, leakRules)
	const shape = "ALTER ROLE leakbob PASSWORD 'S3CRET-%04d'"
	secret := fmt.Sprintf(shape, 4821)
	_, err := s.db.ExecContext(tagging.With(context.Background(), "app", "closed"), secret)
	var be *driver.BlockedError
	if !errors.As(err, &be) {
		t.Fatalf("want a BlockedError, got %v", err)
	}
	// What an observer sees: the span attribute, the log, the status page.
	var spanFP string
	for _, sp := range s.spans.GetSpans() {
		if v := telAttr(sp.Attributes, "pgtraffic.fingerprint").AsString(); v != "" {
			spanFP = v
		}
	}
	w := httptest.NewRecorder()
	s.conn.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/?format=json", nil))
	body, _ := io.ReadAll(w.Result().Body)
	channels := map[string]string{
		"BlockedError.Error()":        err.Error(),
		"span pgtraffic.fingerprint":  spanFP,
		"log":                         s.log.String(),
		"status page (recent_blocks)": string(body),
	}
	// The fingerprint holds nothing of the password: every PIN gives the same one, the
	// fingerprint each channel shows.
	for _, pin := range []int{0, 4821, 9999} {
		if fp := pattern.Analyze(fmt.Sprintf(shape, pin)).Fingerprint; fp != be.Fingerprint {
			t.Errorf("PIN %04d: fingerprint %s, the blocked statement's %s: it depends on the password, which trying each PIN recovers", pin, fp, be.Fingerprint)
		}
	}
	for name, text := range channels {
		if strings.Contains(text, "S3CRET") {
			t.Errorf("%s shows the password: %s", name, text)
		}
	}
}
