// Package shortname makes short, stable names for what a store keeps: the
// 64-bit FNV-1a hash of some strings, written in base64url characters. The
// same strings give the same name in every process and release.
package shortname

// Alphabet is base64url's, in which names are written.
const Alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

// Of returns n base64url characters (6 bits each, n at most 11: the last
// of 11 holds 4) of the hash of parts, each followed by the byte 0xff,
// which no UTF-8 string holds: ("ab", "c") and ("a", "bc") differ.
func Of(n int, parts ...string) string {
	var b [11]byte
	return string(Append(b[:0], n, parts...))
}

// Append appends Of(n, parts...) to dst.
func Append(dst []byte, n int, parts ...string) []byte {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range parts {
		for i := 0; i < len(s); i++ {
			h = (h ^ uint64(s[i])) * prime
		}
		h = (h ^ 0xff) * prime
	}
	for range min(n, 11) {
		dst = append(dst, Alphabet[h&63])
		h >>= 6
	}
	return dst
}
