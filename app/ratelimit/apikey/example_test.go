package apikey_test

import (
	"errors"
	"fmt"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/apikey"
)

// Sign a key for an id, then check it: the rate limiter counts under the id
// that Check returns. A key with a changed character is refused.
func Example() {
	v, err := apikey.NewVerifier("current-secret-0123456789", "previous-secret-0123456789")
	if err != nil {
		fmt.Println(err)
		return
	}
	key, err := v.Sign("tenant-42")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(key)

	id, err := v.Check(key)
	fmt.Println(id, err)

	tampered := key[:len(key)-1] + "A"
	if key[len(key)-1] == 'A' {
		tampered = key[:len(key)-1] + "B"
	}
	_, err = v.Check(tampered)
	fmt.Println(errors.Is(err, apikey.ErrInvalidKey))
	// Output:
	// tenant-42.ovNUqf4Ph3QebUWstXq6TRV1
	// tenant-42 <nil>
	// true
}

// Rotating the secret: the new secret signs, the old one is still accepted
// until the keys it signed are replaced, then dropped.
func ExampleNewVerifier_rotation() {
	before, _ := apikey.NewVerifier("old-secret-0123456789")
	oldKey, _ := before.Sign("tenant-7")

	during, _ := apikey.NewVerifier("new-secret-0123456789", "old-secret-0123456789")
	fmt.Println(during.Check(oldKey))
	newKey, _ := during.Sign("tenant-7")
	fmt.Println(newKey != oldKey)

	after, _ := apikey.NewVerifier("new-secret-0123456789")
	_, err := after.Check(oldKey)
	fmt.Println(errors.Is(err, apikey.ErrInvalidKey))
	fmt.Println(after.Check(newKey))
	// Output:
	// tenant-7 <nil>
	// true
	// true
	// tenant-7 <nil>
}
