package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pgtraffic/pgtraffic/tagging"
)

// TestSecretTags: tag values (a sqlcommenter comment's, a context tag's) are exported on
// purpose as pgtraffic.tag.<key> span attributes and in the debug statement log (documented).
// Everywhere else (db.query.text, the span name, status, metrics, errors, warn logs) they must
// not appear.
func TestSecretTags(t *testing.T) {
	s := newTelSetup(t, leakRules)
	ctx := tagging.With(context.Background(), "session", "S3CRET-CTX")
	queries := []string{
		`select * from orders where id = 1 /*app='closed',token='S3CRET-TAG1'*/`,
		`/*app='closed',token='S3CRET-TAG2'*/ select * from orders where id = 2`,
		`select * from orders where id = 3 /*app='warned',token='S3CRET-TAG3'*/`,
		`select * from orders where id = 4 -- /*token='S3CRET-TAG4'*/`,
		`select * from orders where id = 5 /*token='S3CRET-TAG5'*/;`,
	}
	var errs []string
	for _, q := range queries {
		if _, err := s.db.ExecContext(ctx, q); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) == 0 {
		t.Fatal("no statement was blocked by its comment's app tag")
	}
	for _, e := range errs {
		if strings.Contains(e, secretMarker) {
			t.Errorf("error leaks a tag: %s", e)
		}
	}
	for _, sp := range s.spans.GetSpans() {
		var other []string
		for _, kv := range sp.Attributes {
			if !strings.HasPrefix(string(kv.Key), "pgtraffic.tag.") {
				other = append(other, string(kv.Key)+"="+kv.Value.String())
			}
		}
		for _, ev := range sp.Events {
			other = append(other, spanAttrText(ev.Attributes))
		}
		all := sp.Name + " " + sp.Status.Description + " " + strings.Join(other, " ")
		if strings.Contains(all, secretMarker) {
			t.Errorf("span leaks a tag outside pgtraffic.tag.*: %s", all)
		}
	}
	for _, line := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(line, secretMarker) && !strings.Contains(line, `msg="pgtraffic: statement"`) {
			t.Errorf("log leaks a tag: %s", line)
		}
	}
	w := httptest.NewRecorder()
	s.conn.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	body, _ := io.ReadAll(w.Result().Body)
	snap, _ := json.Marshal(s.conn.Snapshot())
	for name, text := range map[string]string{"status HTML": string(body), "Snapshot": string(snap)} {
		if strings.Contains(text, secretMarker) {
			t.Errorf("%s leaks a tag: %s", name, excerpt(text, secretMarker))
		}
	}
}
