// Package shortname makes short, stable names for what a store keeps: the
// 64-bit FNV-1a hash of some strings, written in base64url characters. The
// same strings give the same name in every process and release.
package shortname

// alphabet is base64url's.
const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// Of returns n base64url characters (6 bits each, n at most 11: the last of 11 holds 4) of the
// hash of parts, each followed by the byte 0xff, which no UTF-8 string
// holds: ("ab", "c") and ("a", "bc") differ.
func Of(n int, parts ...string) string {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range parts {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h = (h ^ 0xff) * prime
	}
	var b [11]byte
	n = min(n, len(b))
	for i := range n {
		b[i] = alphabet[h&63]
		h >>= 6
	}
	return string(b[:n])
}
