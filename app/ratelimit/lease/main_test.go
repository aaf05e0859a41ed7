package lease_test

import (
	"os"
	"testing"

	"github.com/fleetlimit/fleetlimit/app/ratelimit/internal/redistest"
)

// TestMain fails the run if a test leaves a redis-server behind
// (redistest.Main).
func TestMain(m *testing.M) { os.Exit(redistest.Main(m)) }
