package loadtest

import (
	"encoding/json"
	"net/http"
	"strings"
)

// RefusedBy names the policy that refused a 429 answer: the "policy" member
// of its RFC 9457 problem body (the service names the refusing policy
// there), else the first item of its RateLimit header with r=0, else the
// first item. (The header lists the route's policies in the route's order,
// whichever refused: its first item is not necessarily the refusing one.)
// "" when neither says.
func RefusedBy(h http.Header, body []byte) string {
	var problem struct {
		Policy string `json:"policy"`
	}
	if json.Unmarshal(body, &problem) == nil && problem.Policy != "" {
		return problem.Policy
	}
	first := ""
	for item := range strings.SplitSeq(h.Get("RateLimit"), ",") {
		item = strings.TrimSpace(item)
		if !strings.HasPrefix(item, `"`) {
			continue
		}
		end := strings.IndexByte(item[1:], '"')
		if end < 0 {
			continue
		}
		name := item[1 : 1+end]
		if first == "" {
			first = name
		}
		for param := range strings.SplitSeq(item[2+end:], ";") {
			if strings.TrimSpace(param) == "r=0" {
				return name
			}
		}
	}
	return first
}
