package driver

import (
	"context"
	"runtime/debug"
	"strings"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RPCObserver receives every finished RPC (metrics).
type RPCObserver interface {
	RPCFinished(method string, code codes.Code, took time.Duration)
}

// chatty are the RPCs sidecars and kubelet call all the time; they are
// logged at debug level only.
var chatty = map[string]bool{
	"/csi.v1.Identity/Probe":                       true,
	"/csi.v1.Identity/GetPluginInfo":               true,
	"/csi.v1.Identity/GetPluginCapabilities":       true,
	"/csi.v1.Controller/ControllerGetCapabilities": true,
	"/csi.v1.Node/NodeGetCapabilities":             true,
	"/csi.v1.Node/NodeGetVolumeStats":              true,
}

// Interceptor logs every RPC with its method, volume id, duration and code,
// and the request (with every csi_secret field stripped by csi-lib-utils'
// protosanitizer) at debug level. A handler that panics is answered with
// Internal, and the stack is logged, instead of taking the driver down.
func Interceptor(log zerolog.Logger, obs RPCObserver) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		start := time.Now()
		lc := log.With().Str("method", strings.TrimPrefix(info.FullMethod, "/csi.v1."))
		if v, ok := req.(interface{ GetVolumeId() string }); ok && v.GetVolumeId() != "" {
			lc = lc.Str("volume", v.GetVolumeId())
		}
		if v, ok := req.(interface{ GetSourceVolumeId() string }); ok && v.GetSourceVolumeId() != "" {
			lc = lc.Str("volume", v.GetSourceVolumeId())
		}
		if v, ok := req.(interface{ GetSnapshotId() string }); ok && v.GetSnapshotId() != "" {
			lc = lc.Str("snapshot", v.GetSnapshotId())
		}
		l := lc.Logger()
		if l.GetLevel() <= zerolog.DebugLevel {
			l.Debug().Stringer("request", protosanitizer.StripSecrets(req)).Msg("rpc request")
		}
		defer func() {
			if p := recover(); p != nil {
				l.Error().Interface("panic", p).Bytes("stack", debug.Stack()).Msg("rpc handler panicked")
				resp, err = nil, status.Errorf(codes.Internal, "internal error in %s (logged)", info.FullMethod)
			}
			code := status.Code(err)
			took := time.Since(start)
			if obs != nil {
				obs.RPCFinished(info.FullMethod, code, took)
			}
			var ev *zerolog.Event
			switch {
			case code == codes.Internal || code == codes.Unknown:
				ev = l.Error()
			case chatty[info.FullMethod] && code == codes.OK:
				ev = l.Debug()
			default:
				ev = l.Info()
			}
			ev = ev.Float64("took_seconds", took.Seconds()).Str("code", code.String())
			if err != nil {
				ev = ev.Str("error", status.Convert(err).Message())
			}
			ev.Msg("rpc")
		}()
		return handler(ctx, req)
	}
}
