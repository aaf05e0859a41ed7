package apikey_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

const (
	secret1 = "0123456789abcdef-current"
	secret2 = "fedcba9876543210-previous"
	secret3 = "a-third-secret-never-listed"
)

// want computes a key independently of the package, from the format's
// definition.
func want(secret, id string) string {
	h := hmac.New(sha256.New, []byte(secret))
	h.Write([]byte("fleetlimit/api-key/v1:" + id))
	return id + "." + base64.RawURLEncoding.EncodeToString(h.Sum(nil)[:18])
}

func mustVerifier(t testing.TB, secrets ...string) *apikey.Verifier {
	t.Helper()
	v, err := apikey.NewVerifier(secrets...)
	if err != nil {
		t.Fatalf("NewVerifier: %v", err)
	}
	return v
}

func mustSign(t testing.TB, secret, id string) string {
	t.Helper()
	key, err := signWith(secret, id)
	if err != nil {
		t.Fatalf("Sign(%q): %v", id, err)
	}
	return key
}

func TestRoundTrip(t *testing.T) {
	v := mustVerifier(t, secret1)
	for _, id := range []string{
		"a",
		"Z",
		"0",
		"_",
		"-",
		"tenant-42_key",
		strings.Repeat("x", apikey.MaxIDBytes),
		apikey.NewID(),
	} {
		key := mustSign(t, secret1, id)
		if w := want(secret1, id); key != w {
			t.Errorf("Sign(%q) = %q, want %q", id, key, w)
		}
		if len(key) != len(id)+1+24 {
			t.Errorf("Sign(%q): key is %d bytes, want %d", id, len(key), len(id)+25)
		}
		vk, err := v.Sign(id)
		if err != nil || vk != key {
			t.Errorf("Verifier.Sign(%q) = %q, %v; want %q", id, vk, err, key)
		}
		got, err := v.Check(key)
		if err != nil || got != id {
			t.Errorf("Check(Sign(%q)) = %q, %v; want the id", id, got, err)
		}
	}
}

func TestVerifierSignsWithFirstSecret(t *testing.T) {
	v := mustVerifier(t, secret1, secret2)
	key, err := v.Sign("user")
	if err != nil {
		t.Fatal(err)
	}
	if w := mustSign(t, secret1, "user"); key != w {
		t.Errorf("Verifier.Sign = %q, want the first secret's key %q", key, w)
	}
}

func TestRotation(t *testing.T) {
	old := mustSign(t, secret2, "user")
	cur := mustSign(t, secret1, "user")
	tests := []struct {
		name    string
		secrets []string
		key     string
		ok      bool
	}{
		{"current key, current only", []string{secret1}, cur, true},
		{"old key, old still listed", []string{secret1, secret2}, old, true},
		{"old key, old listed first", []string{secret2, secret1}, old, true},
		{"current key, rotation list", []string{secret1, secret2}, cur, true},
		{"old key, rotated out", []string{secret1}, old, false},
		{"old key, other secrets", []string{secret1, secret3}, old, false},
		{"current key, not listed", []string{secret2, secret3}, cur, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := mustVerifier(t, tt.secrets...)
			id, err := v.Check(tt.key)
			if tt.ok {
				if err != nil || id != "user" {
					t.Errorf("Check = %q, %v; want user", id, err)
				}
				return
			}
			if !errors.Is(err, apikey.ErrInvalidKey) || id != "" {
				t.Errorf("Check = %q, %v; want ErrInvalidKey", id, err)
			}
		})
	}
}

// checkRefused fails t unless v refuses key with an error wrapping
// ErrInvalidKey whose text holds neither the key nor its mac.
func checkRefused(t *testing.T, v *apikey.Verifier, key string) {
	t.Helper()
	id, err := v.Check(key)
	if err == nil {
		t.Errorf("Check(%q) = %q, accepted; want ErrInvalidKey", key, id)
		return
	}
	if !errors.Is(err, apikey.ErrInvalidKey) {
		t.Errorf("Check(%q) = %v, does not wrap ErrInvalidKey", key, err)
	}
	if id != "" {
		t.Errorf("Check(%q) returned id %q with error %v", key, id, err)
	}
	// Short strings can occur in any message by chance; real keys are
	// at least 26 bytes.
	msg := err.Error()
	if len(key) >= 8 && strings.Contains(msg, key) {
		t.Errorf("Check(%q): error %q contains the key", key, msg)
	}
	if _, mac, found := strings.Cut(key, "."); found && len(mac) >= 8 && strings.Contains(msg, mac) {
		t.Errorf("Check(%q): error %q contains the mac", key, msg)
	}
}

func TestTamperedEveryPosition(t *testing.T) {
	v := mustVerifier(t, secret1)
	id := "tenant-42_key"
	key := mustSign(t, secret1, id)
	for i := range len(key) {
		for _, c := range []byte{'A', 'b', '9', '_', '-', '.'} {
			if key[i] == c {
				continue
			}
			b := []byte(key)
			b[i] = c
			checkRefused(t, v, string(b))
		}
		// Flip one bit, which may leave the alphabet.
		b := []byte(key)
		b[i] ^= 1
		checkRefused(t, v, string(b))
	}
}

func TestMalformedKeys(t *testing.T) {
	v := mustVerifier(t, secret1, secret2)
	id := "user-1"
	key := mustSign(t, secret1, id)
	mac := key[len(id)+1:]
	tests := []struct {
		name string
		key  string
	}{
		{"empty", ""},
		{"dot only", "."},
		{"id only", id},
		{"id and dot", id + "."},
		{"mac only", mac},
		{"dot and mac", "." + mac},
		{"extra dot at end", key + "."},
		{"extra dot at start", "." + key},
		{"double dot", id + ".." + mac},
		{"dot inside mac", id + "." + mac[:10] + "." + mac[11:]},
		{"dot inside id", "user.1." + mac},
		{"two keys", key + "." + key},
		{"padding", key + "="},
		{"double padding", key + "=="},
		{"padding replacing last char", key[:len(key)-1] + "="},
		{"standard base64 plus", id + "." + "+" + mac[1:]},
		{"standard base64 slash", id + "." + "/" + mac[1:]},
		{"mac one short", key[:len(key)-1]},
		{"mac one long", key + "A"},
		{"mac 23 of 24", id + "." + mac[1:]},
		{"leading space", " " + key},
		{"trailing space", key + " "},
		{"trailing newline", key + "\n"},
		{"trailing CRLF", key + "\r\n"},
		{"tab before mac", id + ".\t" + mac[1:]},
		{"newline in mac, length kept", id + "." + mac[:12] + "\n" + mac[13:]},
		{"newline in mac, char kept", id + "." + mac[:12] + "\n" + mac[12:]},
		{"CR in mac", id + "." + mac[:12] + "\r" + mac[13:]},
		{"space in id", "user 1." + mac},
		{"NUL in id", "user\x001." + mac},
		{"NUL in mac", id + "." + mac[:23] + "\x00"},
		{"unicode id", "usér-1." + mac},
		{"unicode id, mac for ascii", "user-１." + mac},
		{"unicode in mac", id + "." + mac[:21] + "é"},
		{"fullwidth dot", id + "。" + mac},
		{"invalid UTF-8", id + "." + mac[:23] + "\xff"},
		{"uppercased", strings.ToUpper(key)},
		{"lowercased", strings.ToLower(key)},
		{"other id, same mac", "user-2." + mac},
		{"id over 64 bytes", strings.Repeat("a", apikey.MaxIDBytes+1) + "." + mac},
		{"over-long by one", strings.Repeat("a", apikey.MaxIDBytes) + "." + mac + "A"},
		{"over-long, 1 MiB", strings.Repeat("a", 1<<20)},
		{"over-long, 1 MiB with key", key + strings.Repeat("A", 1<<20)},
		{"signed with unlisted secret", mustSign(t, secret3, id)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkRefused(t, v, tt.key)
		})
	}
}

func TestTruncated(t *testing.T) {
	v := mustVerifier(t, secret1)
	key := mustSign(t, secret1, apikey.NewID())
	for n := range len(key) {
		checkRefused(t, v, key[:n])
		checkRefused(t, v, key[n+1:])
	}
}

func TestZeroVerifier(t *testing.T) {
	key := mustSign(t, secret1, "user")
	for _, v := range []*apikey.Verifier{nil, new(apikey.Verifier)} {
		checkRefused(t, v, key)
		checkRefused(t, v, "")
		if k, err := v.Sign("user"); err == nil {
			t.Errorf("Sign on an empty verifier = %q, want an error", k)
		}
	}
}

// Refusing a key does not allocate, however long the key is.
func TestCheckRefusalAllocations(t *testing.T) {
	v := mustVerifier(t, secret1)
	key := mustSign(t, secret1, "user")
	for _, k := range []string{
		strings.Repeat("a", 1<<20),
		"",
		"no-dot-here",
		"user." + strings.Repeat("A", 25),
		"user." + strings.Repeat("=", 24),
	} {
		if n := testing.AllocsPerRun(10, func() { _, _ = v.Check(k) }); n != 0 {
			t.Errorf("Check of a %d-byte key: %v allocations, want 0", len(k), n)
		}
	}
	// A full check allocates a bounded amount, whatever the key.
	if n := testing.AllocsPerRun(10, func() { _, _ = v.Check(key) }); n > 8 {
		t.Errorf("Check of a valid key: %v allocations, want at most 8", n)
	}
}

func TestValidID(t *testing.T) {
	tests := []struct {
		id string
		ok bool
	}{
		{"a", true},
		{"A", true},
		{"0", true},
		{"_", true},
		{"-", true},
		{"abcXYZ019_-", true},
		{strings.Repeat("a", apikey.MaxIDBytes), true},
		{strings.Repeat("a", apikey.MaxIDBytes+1), false},
		{"", false},
		{".", false},
		{"a.b", false},
		{"a b", false},
		{" a", false},
		{"a\n", false},
		{"a=", false},
		{"a+b", false},
		{"a/b", false},
		{"a:b", false},
		{"a\x00", false},
		{"é", false},
		{"ａ", false},
		{"\xff", false},
	}
	for _, tt := range tests {
		err := apikey.ValidID(tt.id)
		if (err == nil) != tt.ok {
			t.Errorf("ValidID(%q) = %v, want ok %v", tt.id, err, tt.ok)
		}
		if err != nil && len(tt.id) > 3 && strings.Contains(err.Error(), tt.id) {
			t.Errorf("ValidID(%q): error %q quotes the id", tt.id, err)
		}
		if _, err := signWith(secret1, tt.id); (err == nil) != tt.ok {
			t.Errorf("Sign(secret, %q) error = %v, want ok %v", tt.id, err, tt.ok)
		}
	}
}

func TestValidSecret(t *testing.T) {
	tests := []struct {
		secret string
		ok     bool
	}{
		{"", false},
		{"x", false},
		{"short-secret", false},
		{strings.Repeat("s", apikey.MinSecretBytes-1), false},
		{strings.Repeat("s", apikey.MinSecretBytes), true},
		{strings.Repeat("s", 1024), true},
		{"any bytes at all\x00\xff é", true},
	}
	for _, tt := range tests {
		err := apikey.ValidSecret(tt.secret)
		if (err == nil) != tt.ok {
			t.Errorf("ValidSecret(%q) = %v, want ok %v", tt.secret, err, tt.ok)
		}
		if err != nil && tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
			t.Errorf("ValidSecret: error %q contains the secret", err)
		}
		_, err = signWith(tt.secret, "user")
		if (err == nil) != tt.ok {
			t.Errorf("Sign(%q, user) error = %v, want ok %v", tt.secret, err, tt.ok)
		}
		if err != nil && tt.secret != "" && strings.Contains(err.Error(), tt.secret) {
			t.Errorf("Sign: error %q contains the secret", err)
		}
	}
}

func TestNewVerifierErrors(t *testing.T) {
	tests := []struct {
		name    string
		secrets []string
	}{
		{"none", nil},
		{"empty list", []string{}},
		{"one empty", []string{""}},
		{"empty after valid", []string{secret1, ""}},
		{"empty before valid", []string{"", secret1}},
		{"short", []string{"too-short"}},
		{"short after valid", []string{secret1, secret2, "too-short"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, err := apikey.NewVerifier(tt.secrets...)
			if err == nil {
				t.Fatalf("NewVerifier = %v, want an error", v)
			}
			for _, s := range tt.secrets {
				if s != "" && strings.Contains(err.Error(), s) {
					t.Errorf("error %q contains a secret", err)
				}
			}
		})
	}
}

func TestNewID(t *testing.T) {
	seen := make(map[string]bool, 1000)
	for range 1000 {
		id := apikey.NewID()
		if len(id) != 22 {
			t.Fatalf("NewID() = %q, %d bytes; want 22", id, len(id))
		}
		if err := apikey.ValidID(id); err != nil {
			t.Fatalf("NewID() = %q, invalid: %v", id, err)
		}
		if seen[id] {
			t.Fatalf("NewID() repeated %q", id)
		}
		seen[id] = true
	}
}

func FuzzCheck(f *testing.F) {
	v, err := apikey.NewVerifier(secret1, secret2)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{secret1, secret2, secret3} {
		for _, id := range []string{"a", "user-1", strings.Repeat("z", apikey.MaxIDBytes)} {
			key, err := signWith(s, id)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(key)
			f.Add(key + "=")
			f.Add(key[:len(key)-1] + "\n")
		}
	}
	for _, k := range []string{"", ".", "a.", ".a", "a.b.c", "é.é", strings.Repeat("a", 200)} {
		f.Add(k)
	}
	f.Fuzz(func(t *testing.T, key string) {
		id, err := v.Check(key)
		if err != nil {
			if !errors.Is(err, apikey.ErrInvalidKey) {
				t.Fatalf("Check(%q) = %v, does not wrap ErrInvalidKey", key, err)
			}
			if id != "" {
				t.Fatalf("Check(%q) returned id %q with an error", key, id)
			}
			return
		}
		if err := apikey.ValidID(id); err != nil {
			t.Fatalf("Check(%q) accepted invalid id %q: %v", key, id, err)
		}
		k1, err1 := signWith(secret1, id)
		k2, err2 := signWith(secret2, id)
		if err1 != nil || err2 != nil {
			t.Fatalf("Sign(%q): %v, %v", id, err1, err2)
		}
		if key != k1 && key != k2 {
			t.Fatalf("Check accepted %q as %q, but the secrets sign %q and %q", key, id, k1, k2)
		}
	})
}

// signWith signs id with a Verifier of the one secret.
func signWith(secret, id string) (string, error) {
	v, err := apikey.NewVerifier(secret)
	if err != nil {
		return "", err
	}
	return v.Sign(id)
}
