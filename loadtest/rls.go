package loadtest

import (
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

var _ pb.RateLimitServiceClient
var _ *grpc.ClientConn
