// Package apikey makes and checks signed API keys, so a rate limiter can
// trust a key's identity without a registry of issued keys.
//
// A key is "<id>.<mac>": id is 1 to maxIDBytes bytes of [A-Za-z0-9_-], and
// mac is the first 18 bytes of HMAC-SHA256(secret, "fleetlimit/api-key/v1:"
// + id) in unpadded URL-safe base64 (24 characters). Rate limiting should
// count under the id that Check returns, never under the raw key.
//
// A Verifier holds one current secret, which signs, and any number of older
// secrets that are still accepted, so secrets can be rotated without
// invalidating keys at once.
package apikey

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
)

// maxIDBytes is the greatest length of a key's id, in bytes.
const maxIDBytes = 64

// MinSecretBytes is the least length of a signing secret, in bytes.
const MinSecretBytes = 16

const (
	// macBytes is how much of the HMAC-SHA256 sum a key carries.
	macBytes = 18
	// macChars is the length of the encoded MAC: 18 bytes are exactly 24
	// unpadded base64 characters, so every valid MAC has one encoding.
	macChars = 24
	// maxKeyBytes is the length of the longest well-formed key.
	maxKeyBytes = maxIDBytes + 1 + macChars
	// domain separates these MACs from any other use of the same secret.
	domain = "fleetlimit/api-key/v1:"
)

// ErrInvalidKey is wrapped by every error Check returns: the key is
// malformed, its id is invalid, or its MAC matches no secret. The text of
// those errors never contains the key or its MAC.
var ErrInvalidKey = errors.New("apikey: invalid key")

// Errors for Check's refusals, made once so that refusing a key allocates
// nothing however much the client sent.
var (
	errEmptyKey  = fmt.Errorf("%w: empty", ErrInvalidKey)
	errLongKey   = fmt.Errorf("%w: longer than %d bytes", ErrInvalidKey, maxKeyBytes)
	errNoDot     = fmt.Errorf("%w: no '.' between id and mac", ErrInvalidKey)
	errMACLength = fmt.Errorf("%w: mac is not %d characters", ErrInvalidKey, macChars)
	errMACChars  = fmt.Errorf("%w: mac is not unpadded URL-safe base64", ErrInvalidKey)
	errWrongMAC  = fmt.Errorf("%w: mac does not match", ErrInvalidKey)
	errBadIDKey  = fmt.Errorf("%w: bad id", ErrInvalidKey)
)

// errNoSecret is returned by a Verifier that was not made by NewVerifier.
var errNoSecret = errors.New("apikey: verifier has no secret")

// ValidID reports whether id can be a key's id: 1 to maxIDBytes bytes, each
// one of [A-Za-z0-9_-]. The error does not quote the id.
func ValidID(id string) error {
	switch {
	case id == "":
		return errors.New("apikey: empty id")
	case len(id) > maxIDBytes:
		return fmt.Errorf("apikey: id longer than %d bytes", maxIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if !idByte(id[i]) {
			return fmt.Errorf("apikey: id byte %d is not one of [A-Za-z0-9_-]", i)
		}
	}
	return nil
}

// validSecret reports whether secret is long enough to sign keys: at least
// MinSecretBytes bytes. The error names the problem, never the secret.
func validSecret(secret string) error {
	switch {
	case secret == "":
		return errors.New("apikey: empty secret")
	case len(secret) < MinSecretBytes:
		return fmt.Errorf("apikey: secret shorter than %d bytes", MinSecretBytes)
	}
	return nil
}

// NewID returns a fresh random id: 16 bytes from crypto/rand in unpadded
// URL-safe base64, 22 characters. It is always a valid id.
func NewID() string {
	var b [16]byte
	// crypto/rand.Read never returns an error; it crashes the program if
	// the system's randomness fails.
	_, _ = rand.Read(b[:])
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// Verifier checks keys against a current secret and any older secrets still
// accepted. Make one with NewVerifier; it is safe for concurrent use.
type Verifier struct {
	// secrets are the accepted secrets, the current one first.
	secrets [][]byte
}

// NewVerifier returns a Verifier that signs with secrets[0] and accepts keys
// signed with any of secrets. It needs at least one secret, and each must
// pass validSecret.
func NewVerifier(secrets ...string) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("apikey: new verifier: no secret")
	}
	v := &Verifier{secrets: make([][]byte, len(secrets))}
	for i, s := range secrets {
		if err := validSecret(s); err != nil {
			return nil, fmt.Errorf("apikey: new verifier: secret %d: %w", i, err)
		}
		v.secrets[i] = []byte(s)
	}
	return v, nil
}

// Sign returns the key for id signed with the current (first) secret.
func (v *Verifier) Sign(id string) (string, error) {
	if v == nil || len(v.secrets) == 0 {
		return "", fmt.Errorf("apikey: sign: %w", errNoSecret)
	}
	if err := ValidID(id); err != nil {
		return "", fmt.Errorf("apikey: sign: %w", err)
	}
	return sign(v.secrets[0], id), nil
}

// Check returns the id of key if key is well formed and its MAC was made
// with one of v's secrets. Every error wraps ErrInvalidKey. The length is
// checked before anything else, so a long key costs no more than a short
// one, and the MACs are compared in constant time.
func (v *Verifier) Check(key string) (id string, err error) {
	switch {
	case key == "":
		return "", errEmptyKey
	case len(key) > maxKeyBytes:
		return "", errLongKey
	}
	dot := strings.IndexByte(key, '.')
	if dot < 0 {
		return "", errNoDot
	}
	id, mac := key[:dot], key[dot+1:]
	if err := ValidID(id); err != nil {
		return "", fmt.Errorf("%w: %w", errBadIDKey, err)
	}
	if len(mac) != macChars {
		return "", errMACLength
	}
	// Check the alphabet first: the decoder skips '\r' and '\n', and only
	// the 64 URL-safe characters make the encoding one-to-one.
	for i := 0; i < len(mac); i++ {
		if !idByte(mac[i]) {
			return "", errMACChars
		}
	}
	var got [macBytes]byte
	if n, err := base64.RawURLEncoding.Decode(got[:], []byte(mac)); err != nil || n != macBytes {
		return "", errMACChars
	}
	if v == nil || len(v.secrets) == 0 {
		return "", errWrongMAC
	}
	ok := false
	for _, s := range v.secrets {
		want := sum(s, id)
		// Compare against every secret, so the time taken does not tell
		// which one matched.
		if hmac.Equal(got[:], want[:macBytes]) {
			ok = true
		}
	}
	if !ok {
		return "", errWrongMAC
	}
	return id, nil
}

// idByte reports whether c is one of [A-Za-z0-9_-], which is both the id
// alphabet and the unpadded URL-safe base64 alphabet.
func idByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// sum returns HMAC-SHA256(secret, domain+id).
func sum(secret []byte, id string) [sha256.Size]byte {
	var msg [len(domain) + maxIDBytes]byte
	m := append(append(msg[:0], domain...), id...)
	h := hmac.New(sha256.New, secret)
	_, _ = h.Write(m)
	var out [sha256.Size]byte
	h.Sum(out[:0])
	return out
}

// sign returns the key for a valid id under secret.
func sign(secret []byte, id string) string {
	s := sum(secret, id)
	var mac [macChars]byte
	base64.RawURLEncoding.Encode(mac[:], s[:macBytes])
	return id + "." + string(mac[:])
}
