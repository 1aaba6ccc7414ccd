package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/health"
	"github.com/csid-dev/csid/internal/metrics"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
)

// backendCheckTTL is how long a backend check's result is reused: probes
// and scrapes together then reach the cloud at most once per period.
const backendCheckTTL = 5 * time.Second

// observability is a process's metrics and health endpoint
// (--metrics-address): the metrics registry whose hooks the store, the
// engine and the gRPC interceptor call, and the HTTP server of /metrics,
// /readyz and /healthz. A nil *observability (no address) hands out nil
// hooks, so a csid without metrics pays nothing for them.
type observability struct {
	m      *metrics.Metrics
	lis    net.Listener
	srv    *http.Server
	served chan error
	log    zerolog.Logger
}

// newObservability builds the metrics of a process, or returns nil when
// metrics are off. It does not listen yet (see start).
func newObservability(o Options, log zerolog.Logger) *observability {
	if o.MetricsAddress == "" && o.MetricsListener == nil {
		return nil
	}
	log = log.With().Str("component", "metrics").Logger()
	return &observability{m: metrics.New(metrics.Options{Version: o.Version, Mode: string(o.Mode), Log: log}), log: log}
}

// storeHook is the store's Observe hook (nil when metrics are off).
func (ob *observability) storeHook() func(int, time.Duration) {
	if ob == nil {
		return nil
	}
	return ob.m.StoreCommitted
}

// opsObserver is the engine's Observer (an untyped nil when metrics are
// off: the engine tests the interface against nil).
func (ob *observability) opsObserver() ops.Observer {
	if ob == nil {
		return nil
	}
	return ob.m
}

// rpcObserver is the interceptor's observer (an untyped nil when off).
func (ob *observability) rpcObserver() driver.RPCObserver {
	if ob == nil {
		return nil
	}
	return ob.m
}

// start registers the store's gauges and serves /metrics, /readyz and
// /healthz. Readiness is the engine's (recovery finished, not shutting
// down), the store's (the file takes writes and is readable; with the
// engine's, what Probe reports) and the backend's (a cheap call, cached for backendCheckTTL).
func (ob *observability) start(o Options, eng *ops.Engine, st *store.Store, srv *grpc.Server, backend func(context.Context) error) error {
	if ob == nil {
		return nil
	}
	var methods []string
	for name, svc := range srv.GetServiceInfo() {
		for _, m := range svc.Methods {
			methods = append(methods, "/"+name+"/"+m.Name)
		}
	}
	ob.m.Serving(methods)
	if err := ob.m.Watch(eng, nil); err != nil {
		return err
	}
	lis := o.MetricsListener
	if lis == nil {
		var err error
		if lis, err = net.Listen("tcp", o.MetricsAddress); err != nil {
			return fmt.Errorf("--metrics-address: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", ob.m.Handler())
	mux.Handle("GET /readyz", health.Ready(
		health.Check{Name: "engine", Run: func(context.Context) error {
			if !eng.Started() {
				return errors.New("operations not recovered yet, or shutting down")
			}
			return nil
		}},
		health.Check{Name: "store", Run: func(context.Context) error {
			if err := st.Health(); err != nil {
				return err
			}
			return st.View(func(*store.Tx) error { return nil })
		}},
		health.Check{Name: "backend", Run: health.Cached(backend, backendCheckTTL, health.Timeout, nil)},
	))
	mux.Handle("GET /healthz", health.Live())
	ob.lis, ob.served = lis, make(chan error, 1)
	ob.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 30 * time.Second, IdleTimeout: time.Minute}
	go func() { ob.served <- ob.srv.Serve(lis) }()
	ob.log.Info().Str("address", lis.Addr().String()).Msg("serving /metrics, /readyz and /healthz")
	return nil
}

// stop closes the HTTP server: in-flight scrapes get a moment to finish.
// It runs before the store is closed.
func (ob *observability) stop() {
	if ob == nil || ob.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := ob.srv.Shutdown(ctx); err != nil {
		_ = ob.srv.Close()
	}
	if err := <-ob.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		ob.log.Error().Err(err).Msg("metrics server stopped")
	}
}

// backendCheck is a cheap call that shows the backend answers: the node's
// own record for a process with a node service, the default zone's
// capacity for a controller (whose host is not a registered node).
func backendCheck(mode driver.Mode, c cloud.Cloud, nodeID string) func(context.Context) error {
	if mode == driver.ModeController {
		return func(ctx context.Context) error {
			_, err := c.Capacity(ctx, "")
			return err
		}
	}
	return func(ctx context.Context) error {
		_, err := c.GetNode(ctx, nodeID)
		return err
	}
}
