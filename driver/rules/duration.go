package rules

import (
	"encoding/json"
	"fmt"
	"time"
)

// Duration is a [time.Duration] written in rules files as a Go duration string: "250ms",
// "2s", "1m30s". A bare number is rejected (except 0): "2" could mean seconds or
// nanoseconds, and a rules file should not leave that to a guess. The zero Duration means
// the field is omitted.
type Duration time.Duration

// String formats d as time.Duration does ("1m0s").
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes d as a duration string, for YAML and JSON.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText parses a duration string such as "250ms".
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := parseDuration(string(text))
	if err != nil {
		return fmt.Errorf("pgtraffic: %w", err)
	}
	*d = v
	return nil
}

// parseDuration parses s with time.ParseDuration and words the error for a rules file.
func parseDuration(s string) (Duration, error) {
	v, err := time.ParseDuration(s)
	if err != nil {
		if isBareNumber(s) && len(s) <= maxQuoted {
			return 0, fmt.Errorf("duration %s has no unit (write e.g. %ss or %sms)", quoteShort(s), s, s)
		}
		return 0, fmt.Errorf("invalid duration %s (write e.g. 250ms, 2s, 1m)", quoteShort(s))
	}
	return Duration(v), nil
}

func isBareNumber(s string) bool {
	if s == "" {
		return false
	}
	dot, digit := false, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c == '.' && !dot:
			dot = true
		case (c == '-' || c == '+') && i == 0 && len(s) > 1:
		default:
			return false
		}
	}
	return digit
}

func marshalJSON(v any) ([]byte, error) { return json.Marshal(v) }
