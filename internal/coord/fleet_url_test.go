package coord

import (
	"strings"
	"testing"
)

// TestFleetURLOptionErrorSaysWhich: a client option of the coordination URL (its query) that
// go-redis refuses makes an error that names the option, so that a user can tell a misspelt
// option from a bad value and which of several options is wrong, where it used to say only
// "invalid Redis URL redis://xxxxx@host:6379/0?xxxxx". The rules refuse such a URL with its
// line already (driver/rules); this is the error of a URL that reaches the client otherwise.
// The option's name is not a secret; its value may be, and the password is: neither appears.
func TestFleetURLOptionErrorSaysWhich(t *testing.T) {
	for _, tc := range []struct{ url, option, value string }{
		{"redis://:Pa55word@127.0.0.1:6379/0?dial_timeout=nonsense", "dial_timeout", "nonsense"},
		{"redis://:Pa55word@127.0.0.1:6379/0?pool_size=8&readTimeout=2s", "readTimeout", "2s"},
		{"rediss://:Pa55word@127.0.0.1:6379/0?max_retries=lots", "max_retries", "lots"},
	} {
		_, err := New(Options{URL: tc.url})
		if err == nil {
			t.Fatalf("%s: no error", tc.option)
		}
		if strings.Contains(err.Error(), "Pa55word") || strings.Contains(err.Error(), tc.value) {
			t.Fatalf("the error shows the password or the option's value: %v", err)
		}
		if !strings.Contains(err.Error(), tc.option) {
			t.Errorf("a URL whose option %s is invalid: the error does not say which option: %v", tc.option, err)
		}
	}
}

// TestFleetURLOptionNameOfAPasswordNotShown: an option name that may be the rest of a password
// whose '?' was written as is (one holding an '@', a ':' or a '/', or too long for an option's)
// is not shown, nor is the first part of the password, which the URL reads as its host and port.
func TestFleetURLOptionNameOfAPasswordNotShown(t *testing.T) {
	for _, tc := range []struct{ url, secret string }{
		{"redis://default:2024?Blue-Otter@redis.internal:6379/0", "Otter"},
		{"redis://default:2024?Blue-Otter@redis.internal:6379/0", "2024"},
		{"redis://127.0.0.1:6379/0?" + strings.Repeat("Otter", 10), "Otter"},
		{"redis://127.0.0.1:6379/0?Ot:ter", "Ot:ter"},
		{"redis://127.0.0.1:6379/0?Ot%2Fter", "Ot/ter"},
	} {
		_, err := New(Options{URL: tc.url})
		if err == nil {
			t.Fatalf("%s: no error", tc.url)
		}
		if strings.Contains(err.Error(), tc.secret) {
			t.Errorf("%s: the error shows %q: %v", tc.url, tc.secret, err)
		}
	}
}
