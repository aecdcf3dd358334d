package driver

import (
	"strings"
	"testing"
)

// TestPasswordWithQuestionMarkNeverShown: a Redis password holding a '?' that the user forgot
// to percent-encode (redis://default:2024?Blue-Otter@...) does not appear, whole or in part, in
// any error or in the redacted URL, as the README promises ("no error or log shows the value of
// coordination.redis"), and as for an unencoded '#'.
//
// The '?' ends the URL's authority: "default:2024" reads as host and port, and the rest of the
// password as a query option. Such a URL, with an '@' after its host, used to be accepted, and
// NewConnector's error quoted that option ("go-redis reads no option
// \"Blue-Otter@redis.internal:6379/0\"", or with a '=' after the '?', its name "Blue"), and
// both it and Coordination.String showed the first part ("redis://default:2024?xxxxx"). The
// rules file is now refused, saying to percent-encode the password and showing none of it.
func TestPasswordWithQuestionMarkNeverShown(t *testing.T) {
	for _, pw := range []string{"2024?Blue-Otter", "2024?Blue=Otter"} {
		secretParts := strings.SplitN(strings.SplitN(pw, "=", 2)[0], "?", 2)
		url := "redis://default:" + pw + "@redis.internal:6379/0"
		doc := "coordination: {redis: '" + url + "'}\nbudgets: [{name: a, max_concurrent: 1}]\nrules: [{budget: a, match: {app: x}}]\n"
		var shown []string
		cfg, err := ParseConfig([]byte(doc))
		if err != nil {
			shown = append(shown, "ParseConfig: "+err.Error())
		} else {
			shown = append(shown, "Coordination.String: "+cfg.Coordination.String())
			c, err := NewConnector("postgres://app@127.0.0.1:1/shop", WithConfig(cfg))
			if err != nil {
				shown = append(shown, "NewConnector: "+err.Error())
			} else {
				c.Close()
			}
		}
		for _, s := range shown {
			for _, part := range secretParts {
				if strings.Contains(s, part) {
					t.Errorf("password %q: part %q shown in %s", pw, part, s)
				}
			}
		}
	}
}
