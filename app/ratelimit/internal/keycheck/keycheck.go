// Package keycheck holds the rule for a client identity (ratelimit.Request's
// Key), shared by the root package's validation and the packages that take
// identities outside a Request (resets, instance names, the journal).
package keycheck

import (
	"errors"
	"fmt"
)

// Check reports why key is not usable as a client identity, or nil: it must
// be 1 to maxBytes bytes with no ASCII control character.
func Check(key string, maxBytes int) error {
	if key == "" {
		return errors.New("empty key")
	}
	if len(key) > maxBytes {
		return fmt.Errorf("key longer than %d bytes", maxBytes)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x20 || key[i] == 0x7f {
			return errors.New("key holds a control character")
		}
	}
	return nil
}
