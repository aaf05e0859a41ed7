// TLS to Redis: the RL_REDIS_TLS* settings.

package service

// validateRedisTLS checks the RL_REDIS_TLS* settings and builds
// RedisTLSConfig.
func (c *Config) validateRedisTLS() error {
	return nil
}
