// Guards against ways around the limit: the published demo secret, request
// ids as idempotency keys (RL_TRUST_REQUEST_ID, RL_RESEND_WINDOW), and the
// admin port's profiler.

package service

import (
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DemoAPIKeySecret is the API-key secret the README and the demo stacks
// publish. Anyone can sign keys with it, so the service refuses it unless
// RL_DEMO=true.
const DemoAPIKeySecret = "fleetlimit-demo-secret-change-me"

// DemoAdminToken is the admin token the demo stacks set unless
// RL_ADMIN_TOKEN is given. It is published too, so the service refuses it
// unless RL_DEMO=true.
const DemoAdminToken = "fleetlimit-demo-admin-token-change-me"

// validateGuards checks the guard settings (see Config).
func (c *Config) validateGuards() error {
	if slices.Contains(c.APIKeySecrets, DemoAPIKeySecret) && !c.Demo {
		return configErr("RL_API_KEY_SECRET", "is the published demo secret, with which anyone can sign keys: "+
			"set a secret of your own (openssl rand -base64 32), or RL_DEMO=true for a demo")
	}
	if slices.Contains(c.AdminTokens, DemoAdminToken) && !c.Demo {
		return configErr("RL_ADMIN_TOKEN", "is the published demo token, with which anyone can reset any client's limits: "+
			"set a token of your own (openssl rand -base64 32), or RL_DEMO=true for a demo")
	}
	if err := c.validateAdminTokens(); err != nil {
		return err
	}
	// At most a minute: a longer window only lengthens what a client
	// repeating an id it could choose gets for free.
	if c.ResendWindow < time.Millisecond || c.ResendWindow > time.Minute {
		return configErr("RL_RESEND_WINDOW", "must be between 1ms and 1m, got %v", c.ResendWindow)
	}
	return nil
}

// startGuards logs demo mode and exports the guards' metrics: demo mode,
// and the resets (reset.go).
func (s *Server) startGuards() {
	demo := 0.0
	if s.cfg.Demo {
		demo = 1
		s.log.Warn("demo mode (RL_DEMO=true): the published demo API-key secret is accepted, and anyone can sign keys with it; never run a real deployment so")
	}
	s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_demo_mode",
		Help: "1 when the instance runs in demo mode (RL_DEMO=true: the published demo API-key secret is accepted), else 0.",
	}, func() float64 { return demo }))
	s.resets = s.watchResets()
}
