package rules

import (
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// FuzzParseDuration: a rules file's duration is read exactly as time.ParseDuration reads it,
// but a bare number other than zero, which is refused; what is read writes back (MarshalText)
// to text that reads as the same duration; an error is short, valid UTF-8, quotes at most
// maxQuoted bytes of the text and none of a text that may hold a credential.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{
		"250ms", "2s", "1m30s", "0", "+0", "-0", "0.0", "2", "-2", "1.5", ".5", "5.", ".", "+", "-", "",
		"1h2m3.5s", "-1.5h", "9223372036854775807ns", "9223372036854775808ns", "2562047h47m16.854775807s",
		"1µs", "1us", "1μs", "1e3s", "1 s", " 1s", "1s ", "1S", "0x10s", "nan", "inf",
		"redis://u:secret@h", "password=hunter2", "user@host", "12345678901234567890123456789012345",
		strings.Repeat("9", 40), strings.Repeat("é", 20) + "s", "\xff\xfes", "1s\x00",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseDuration(s)
		want, werr := time.ParseDuration(s)
		if err == nil {
			if werr != nil || time.Duration(d) != want {
				t.Fatalf("parseDuration(%q) = %v, time.ParseDuration: %v, %v", s, d, want, werr)
			}
			if isBareNumber(s) && d != 0 {
				t.Fatalf("parseDuration(%q) = %v: a bare number with no unit", s, d)
			}
			// The round trip, as a rules file and its JSON or YAML export write it.
			text, _ := d.MarshalText()
			var back Duration
			if err := back.UnmarshalText(text); err != nil || back != d {
				t.Fatalf("%q read as %v, written as %q, read back as %v, %v", s, d, text, back, err)
			}
			return
		}
		if d != 0 {
			t.Fatalf("parseDuration(%q) = %v with error %v", s, d, err)
		}
		msg := err.Error()
		if len(msg) > 200 || !utf8.ValidString(msg) {
			t.Fatalf("parseDuration(%q): an error of %d bytes or invalid UTF-8: %q", s, len(msg), msg)
		}
		if strings.Contains(s, "://") || strings.ContainsAny(s, "@=") {
			if !strings.Contains(msg, "not shown") {
				t.Fatalf("parseDuration(%q) shows a text that may hold a credential: %s", s, msg)
			}
		} else if i := strings.IndexByte(msg, '"'); i >= 0 {
			// The text quoted is a prefix of s of at most maxQuoted bytes.
			q, err := strconv.QuotedPrefix(msg[i:])
			unq, _ := strconv.Unquote(q)
			if err != nil || len(unq) > maxQuoted || !strings.HasPrefix(s, unq) {
				t.Fatalf("parseDuration(%q) quotes %q: %s", s, unq, msg)
			}
		} else if len(s) > maxQuoted {
			t.Fatalf("parseDuration(%q) words an error without quoting: %s", s, msg)
		}
		if werr == nil {
			t.Fatalf("parseDuration(%q) refused what time.ParseDuration reads as %v: %v", s, want, err)
		}
	})
}
