package rules

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/pgtraffic/pgtraffic/driver/rules/vocab"
)

// ExactMatchValue is the value an exact match of tag key compares tags with: v, but for the
// built-in table tag the name as PostgreSQL resolves it (TableName), since that tag holds the
// names pg_query resolved, and for the built-in fingerprint tag the fingerprint in lower case
// (FingerprintValue).
func ExactMatchValue(key, v string) (string, error) {
	switch key {
	case vocab.KeyTable:
		return TableName(v)
	case vocab.KeyFingerprint:
		return FingerprintValue(v)
	}
	return v, nil
}

// FingerprintValue is the fingerprint a match value for the fingerprint tag names: 16
// hexadecimal digits, as vocab.FingerprintHex spells them (driver.Fingerprint, the status page,
// a BlockedError), upper-case digits folded. Anything else (a fingerprint cut short, or with a
// space) is an error: it would match no statement.
func FingerprintValue(v string) (string, error) {
	b := []byte(v)
	valid := len(b) == len(vocab.FingerprintHex(0))
	for i, c := range b {
		switch {
		case 'A' <= c && c <= 'F':
			b[i] = c + 'a' - 'A'
		case '0' <= c && c <= '9', 'a' <= c && c <= 'f':
		default:
			valid = false
		}
	}
	if !valid {
		return "", fmt.Errorf("fingerprint %s: want 16 hexadecimal digits, as driver.Fingerprint and the status page give it; it would match no statement", quoteShort(v))
	}
	return string(b), nil
}

// TableName is the name a match value for the table tag stands for, as PostgreSQL resolves a
// name written in SQL: each dot-separated part folded to lower case (ASCII letters, as the
// server folds them) unless it is double-quoted, where "" stands for a quote. So {table: Orders}
// matches DELETE FROM Orders, whose table is orders, and {table: '"Orders"'} matches DELETE
// FROM "Orders". An unterminated quote is an error.
func TableName(v string) (string, error) {
	if !strings.ContainsAny(v, `"ABCDEFGHIJKLMNOPQRSTUVWXYZ`) {
		return v, nil // the common case: already as PostgreSQL resolves it
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c != '"' {
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			b.WriteByte(c)
			continue
		}
		for i++; ; i++ {
			switch {
			case i == len(v):
				return "", errUnterminatedName
			case v[i] != '"':
				b.WriteByte(v[i])
				continue
			case i+1 < len(v) && v[i+1] == '"':
				b.WriteByte('"')
				i++
				continue
			}
			break
		}
	}
	return b.String(), nil
}

var errUnterminatedName = errors.New(`a table name with an unterminated double quote (write "" for a quote inside a quoted name)`)

// ParseMatchValue classifies a rule's match value. When the value is meant as a CIDR prefix
// (see [Rule]) it returns the prefix, masked and with IPv4-mapped IPv6 prefixes (of 96 bits
// or more) turned into IPv4 ones, so that it matches tag values after [netip.Addr.Unmap]; an
// error when such a value is not a valid prefix; and isPrefix false for an exact value.
func ParseMatchValue(v string) (p netip.Prefix, isPrefix bool, err error) {
	if !looksLikePrefix(v) {
		return netip.Prefix{}, false, nil
	}
	p, err = netip.ParsePrefix(v)
	if err != nil {
		return netip.Prefix{}, true, fmt.Errorf("invalid CIDR prefix %s", quoteShort(v))
	}
	return normalizePrefix(p), true, nil
}

// normalizePrefix masks p and turns an IPv4-mapped IPv6 prefix of 96 bits or more into the
// IPv4 prefix it covers.
func normalizePrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// looksLikePrefix reports whether v was written as a CIDR prefix: something before a '/'
// shaped like an IPv4 address (digits and dots) or an IPv6 one (hex digits
// and colons). Routes (/api/x) and names (db.a/x) are exact values.
func looksLikePrefix(v string) bool {
	addr, _, ok := strings.Cut(v, "/")
	if !ok || addr == "" {
		return false
	}
	colon, dot, digit, letter := false, false, false, false
	for i := 0; i < len(addr); i++ {
		switch c := addr[i]; {
		case c >= '0' && c <= '9':
			digit = true
		case c == ':':
			colon = true
		case c == '.':
			dot = true
		case c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F':
			letter = true
		default:
			return false
		}
	}
	return colon || dot && digit && !letter
}
