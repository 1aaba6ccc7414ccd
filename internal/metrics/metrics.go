// Package metrics exposes a csid process to Prometheus. A Metrics value owns
// its own registry (no global state: two csid processes in one test binary
// never share a counter) and is the observer the layers below call:
// driver.RPCObserver for every RPC, ops.Observer for every finished op and
// retry, and StoreCommitted for every store commit. The gauges (volumes by
// state, ops in flight, the resize queue, the state file's size) are not
// kept up to date by hooks: a collector reads them from the store, in one
// read transaction, on each scrape, so they are right after a restart and
// cannot drift.
//
// Every name starts with csid_ and is in base units (seconds, bytes); see
// docs/operations.md, "Metrics and alerts", for the list and example alerts.
package metrics

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
)

// Outcomes of an op, the values of the outcome label (as ops reports them).
const (
	OutcomeSucceeded = "succeeded"
	OutcomeFailed    = "failed"
)

// latencyBuckets cover a cached answer (100 µs) to a cloud operation that
// takes minutes; rpcs and ops share them so the two can be compared.
var latencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}

// commitBuckets cover an fsync on fast flash (50 µs) to a stalled disk.
var commitBuckets = []float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
	0.025, 0.05, 0.1, 0.25, 1}

// batchBuckets are powers of two up to the store's default MaxBatch (256).
var batchBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256}

// Options describe the process, for csid_build_info.
type Options struct {
	Version string
	// Mode is all, controller or node.
	Mode string
	// Log receives errors of scrapes (a store that cannot be read); the
	// caller names the component (csid serve's is "metrics").
	Log zerolog.Logger
}

// Metrics holds a process's registry and the instruments the hooks update.
// Its methods are safe for concurrent use and never block.
type Metrics struct {
	reg *prometheus.Registry
	log zerolog.Logger

	rpc         *prometheus.HistogramVec
	rpcs        *prometheus.CounterVec
	ops         *prometheus.CounterVec
	waits       *prometheus.CounterVec
	opDuration  *prometheus.HistogramVec
	retries     *prometheus.CounterVec
	commit      prometheus.Histogram
	commitBatch prometheus.Histogram
}

// Compile-time checks that Metrics is the observer each layer takes.
var (
	_ driver.RPCObserver = (*Metrics)(nil)
	_ ops.Observer       = (*Metrics)(nil)
)

// New builds the registry with the hook-driven instruments, csid_build_info,
// and the Go runtime and process collectors. Add the store's gauges with
// Watch once the engine exists.
func New(o Options) *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		log: o.Log,
		rpc: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "csid_rpc_duration_seconds",
			Help:    "Time csid took to answer a CSI RPC, by method (CreateVolume, NodePublishVolume, ...).",
			Buckets: latencyBuckets,
		}, []string{"method"}),
		rpcs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csid_rpcs_total",
			Help: "CSI RPCs answered, by method and gRPC status code.",
		}, []string{"method", "code"}),
		waits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csid_op_waits_total",
			Help: "Requests that waited on an operation already in flight which they did not start (a CO's retry joining it, a publish held by a resize), by the request's event.",
		}, []string{"event"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csid_ops_total",
			Help: "Operations finished, by event (create, controller_publish, ...) and outcome (succeeded, failed).",
		}, []string{"event", "outcome"}),
		opDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "csid_op_duration_seconds",
			Help:    "Time from an operation's acceptance to the commit of its outcome (queueing, effects, retries and backoff included), by event.",
			Buckets: latencyBuckets,
		}, []string{"event"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "csid_op_retries_total",
			Help: "Attempts of operations that failed transiently and were scheduled for a retry, by event.",
		}, []string{"event"}),
		commit: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csid_store_commit_duration_seconds",
			Help:    "Time of one state-file commit (one bbolt transaction including its fsync), shared by every write in its batch.",
			Buckets: commitBuckets,
		}),
		commitBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "csid_store_commit_batch_size",
			Help:    "Writes (store updates) sharing one commit: the group commit's batch.",
			Buckets: batchBuckets,
		}),
	}
	// Every labelled series from the start, so that rate() and alerts see
	// a zero rather than no series.
	for _, e := range fsm.AllOpEvents() {
		m.ops.WithLabelValues(string(e), OutcomeSucceeded)
		m.ops.WithLabelValues(string(e), OutcomeFailed)
		m.retries.WithLabelValues(string(e))
		m.waits.WithLabelValues(string(e))
		m.opDuration.WithLabelValues(string(e))
	}

	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "csid_build_info",
		Help:        "Always 1; the labels say which csid runs, and in which mode.",
		ConstLabels: prometheus.Labels{"version": o.Version, "mode": o.Mode},
	})
	build.Set(1)
	m.reg.MustRegister(m.rpc, m.rpcs, m.ops, m.waits, m.opDuration, m.retries, m.commit, m.commitBatch, build,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Serving makes the RPC series of the methods the process serves (full
// gRPC names, as the interceptor sees them) exist at zero, before the
// first call.
func (m *Metrics) Serving(methods []string) {
	for _, full := range methods {
		method := methodLabel(full)
		m.rpc.WithLabelValues(method)
		for _, c := range RPCCodes {
			m.rpcs.WithLabelValues(method, c.String())
		}
	}
}

// Registry is the process's registry (tests gather from it directly).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in Prometheus's exposition formats. A gauge
// that cannot be read (the store failing) is left out of the scrape and
// logged; the rest is still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorLog:            errorLog{m.log},
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            m.reg,
		MaxRequestsInFlight: 4,
	})
}

// RPCFinished records one RPC (driver.RPCObserver). method is gRPC's full
// method name; the label is its last element ("CreateVolume"), which is
// unique across the CSI services.
func (m *Metrics) RPCFinished(method string, code codes.Code, took time.Duration) {
	method = methodLabel(method)
	m.rpc.WithLabelValues(method).Observe(took.Seconds())
	m.rpcs.WithLabelValues(method, code.String()).Inc()
}

// methodLabel is the last element of a full gRPC method name.
func methodLabel(full string) string {
	if i := strings.LastIndexByte(full, '/'); i >= 0 {
		return full[i+1:]
	}
	return full
}

// RPCCodes are the status codes csid answers with (the engine's kinds',
// OK, and the two a caller's context ends with): the codes of
// csid_rpcs_total's series that exist from the start.
var RPCCodes = []codes.Code{codes.OK, codes.Canceled, codes.InvalidArgument, codes.DeadlineExceeded, codes.NotFound,
	codes.AlreadyExists, codes.ResourceExhausted, codes.FailedPrecondition, codes.Aborted, codes.OutOfRange,
	codes.Unimplemented, codes.Internal, codes.Unavailable, codes.DataLoss}

// OpFinished records a finished op (ops.Observer).
func (m *Metrics) OpFinished(e fsm.Event, outcome string, took time.Duration) {
	m.ops.WithLabelValues(string(e), outcome).Inc()
	m.opDuration.WithLabelValues(string(e)).Observe(took.Seconds())
}

// OpRetried records a transient failure that will be retried (ops.Observer).
func (m *Metrics) OpRetried(e fsm.Event) { m.retries.WithLabelValues(string(e)).Inc() }

// OpWaited records a request waiting on an op it did not start
// (ops.Observer).
func (m *Metrics) OpWaited(e, _ fsm.Event, _ uint64) { m.waits.WithLabelValues(string(e)).Inc() }

// StoreCommitted records one store commit: the store.Options.Observe hook.
func (m *Metrics) StoreCommitted(batch int, took time.Duration) {
	m.commit.Observe(took.Seconds())
	m.commitBatch.Observe(float64(batch))
}

// errorLog adapts zerolog to promhttp's Logger.
type errorLog struct{ log zerolog.Logger }

func (l errorLog) Println(v ...any) {
	l.log.Error().Msg(strings.TrimSpace(fmt.Sprintln(v...)))
}
