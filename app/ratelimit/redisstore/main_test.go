package redisstore_test

import (
	"os"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// TestMain runs the tests and the examples, with the examples' redis-server
// up (redistest.Main).
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
