package budget

import (
	"crypto/sha256"
	"encoding/hex"
)

// MaxKeyLen is the longest value of a budget's per tag that keys its state as it is: the value
// comes from a client (a header, a comment), and a table of up to MaxKeys of them (and Redis's
// partitions of a shared budget) must not hold megabytes each.
const MaxKeyLen = 128

// KeyOf is the key of the state of per-tag value v ([Request.Key]): v itself, or "#" and 32
// hex digits of its SHA-256 when v is longer than MaxKeyLen.
func KeyOf(v string) string {
	if len(v) <= MaxKeyLen {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "#" + hex.EncodeToString(sum[:16])
}
