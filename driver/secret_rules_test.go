package driver

import (
	"strings"
	"testing"
)

// TestSecretRulesErrors feeds rules files whose mistakes sit next to (or in) a secret, such
// as a Redis URL with a password put in the wrong place, and checks that the error, which the
// application logs and the watcher logs on reload, does not quote it.
func TestSecretRulesErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"misindented redis":  "coordination:\nredis: redis://:S3CRETPW@h:6379/0\n",
		"redis in a budget":  "budgets:\n  - name: a\n    redis: redis://:S3CRETPW@h:6379/0\n",
		"redis as a list":    "coordination:\n  redis: [redis://:S3CRETPW@h:6379/0]\n",
		"redis bad db":       "coordination:\n  redis: redis://:S3CRETPW@h:6379/x\n",
		"redis bad port":     "coordination:\n  redis: redis://u:S3CRETPW@h:99999/0\n",
		"redis opaque":       "coordination:\n  redis: redis:S3CRETPW@h\n",
		"redis wrong scheme": "coordination:\n  redis: http://u:S3CRETPW@h/\n",
		"int field":          "coordination:\n  redis: redis://h:6379/0\n  fallback_instances: S3CRETPW\n",
		"duration field":     "coordination:\n  redis: redis://h:6379/0\n  sync_interval: S3CRETPW\n",
		"yaml syntax":        "coordination:\n  redis: \"redis://:S3CRETPW@h:6379/0\n",
		"yaml syntax 2":      "coordination:\n  redis: redis://:S3CRETPW@h:6379/0\n   - x: [\n",
		"anchor":             "coordination:\n  redis: *S3CRETPW\n",
		"json":               `{"coordination": {"redis": "redis://:S3CRETPW@h:6379/0", "sync_interval": "S3CRETPW"}}`,
		"match value":        "budgets:\n  - name: a\nrules:\n  - budget: a\n    match: {token: [S3CRETPW]}\n",
	} {
		_, err := ParseConfig([]byte(doc))
		if err == nil {
			t.Logf("%s: accepted", name)
			continue
		}
		if strings.Contains(err.Error(), "S3CRET") {
			t.Errorf("%s: the error quotes the secret: %v", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}
