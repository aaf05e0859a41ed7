package service

import (
	"encoding/json"
	"net/http"
	"sync/atomic"
	"time"
)

// wallClock is the service's wall clock: the host's, moved by an offset
// that only a chaos stack sets (RL_DEBUG_CLOCK, POST /debug/clock), so the
// chaos suite can step one instance's clock without touching the host's.
// The resilient limiter reads it once, at start, and measures time on the
// monotonic clock after (resilient.Config.Now): a step must not move its
// fallback (the clock-step scenario).
type wallClock struct{ offset atomic.Int64 }

// Now returns the host's wall clock plus the offset, without a monotonic
// reading: a consumer that compared two of them would see the step, as it
// would see an NTP step of a real clock.
func (c *wallClock) Now() time.Time { return time.Now().Round(0).Add(time.Duration(c.offset.Load())) }

// serveClock is POST /debug/clock ({"offset": "10s"}: the wall clock from
// now on is the host's plus 10 s; "0s" puts it back) and GET /debug/clock.
func (c *wallClock) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost {
		var body struct {
			Offset string `json:"offset"`
		}
		err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1024)).Decode(&body)
		var d time.Duration
		if err == nil {
			d, err = time.ParseDuration(body.Offset)
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"offset": "<duration>"}: ` + err.Error()})
			return
		}
		c.offset.Store(int64(d))
	}
	writeJSON(w, http.StatusOK, map[string]string{"offset": time.Duration(c.offset.Load()).String(), "now": c.Now().UTC().Format(time.RFC3339Nano)})
}
