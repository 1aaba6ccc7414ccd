package yandexfake

import (
	"context"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/endpoint"
	iam "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
)

// Methods the fake serves, by full gRPC name, for the knobs.
const (
	MethodEndpointList     = endpoint.ApiEndpointService_List_FullMethodName
	MethodEndpointGet      = endpoint.ApiEndpointService_Get_FullMethodName
	MethodIAMTokenCreate   = iam.IamTokenService_Create_FullMethodName
	MethodDiskGet          = compute.DiskService_Get_FullMethodName
	MethodDiskList         = compute.DiskService_List_FullMethodName
	MethodDiskCreate       = compute.DiskService_Create_FullMethodName
	MethodDiskUpdate       = compute.DiskService_Update_FullMethodName
	MethodDiskDelete       = compute.DiskService_Delete_FullMethodName
	MethodDiskOperations   = compute.DiskService_ListOperations_FullMethodName
	MethodInstanceGet      = compute.InstanceService_Get_FullMethodName
	MethodInstanceAttach   = compute.InstanceService_AttachDisk_FullMethodName
	MethodInstanceDetach   = compute.InstanceService_DetachDisk_FullMethodName
	MethodZoneGet          = compute.ZoneService_Get_FullMethodName
	MethodZoneList         = compute.ZoneService_List_FullMethodName
	MethodOperationGet     = operation.OperationService_Get_FullMethodName
	MethodOperationCancel  = operation.OperationService_Cancel_FullMethodName
	methodAPIPrefixCompute = "/yandex.cloud.compute."
	methodAPIPrefixOp      = "/yandex.cloud.operation."
)

// isAPI reports whether method is a Compute or Operation call: the calls
// that need a token and that a Throttle of "" covers.
func isAPI(method string) bool {
	return strings.HasPrefix(method, methodAPIPrefixCompute) || strings.HasPrefix(method, methodAPIPrefixOp)
}

// Request is one request the fake received (Seen).
type Request struct {
	Method string
	// At is when it arrived.
	At time.Time
	// Metadata is the request's gRPC metadata (headers), as received.
	Metadata metadata.MD
	// Body is the request message in protojson.
	Body []byte
}

// Throttling describes a throttled API (Throttle).
type Throttling struct {
	// Method is the method throttled; "" throttles every Compute and
	// Operation call (not endpoint discovery or IAM, which a Method names
	// explicitly).
	Method string
	// Code is the answer; default ResourceExhausted (without a
	// QuotaFailure detail, which marks a quota).
	Code codes.Code
	// Calls is the number of calls answered so; For is how long. The
	// throttling ends when either runs out; with both zero it lasts until
	// Unthrottle.
	Calls int
	For   time.Duration
}

type throttle struct {
	Throttling
	until time.Time
	left  int
}

// failure is a fault armed for the next n calls (or operations) of a
// method.
type failure struct {
	code codes.Code
	n    int
}

// faults are the failures armed, by method. Callers hold knobs.mu.
type faults map[string]*failure

// set arms a failure with code for the next n calls of method; n <= 0
// clears it.
func (m faults) set(method string, code codes.Code, n int) {
	if n <= 0 {
		delete(m, method)
		return
	}
	m[method] = &failure{code: code, n: n}
}

// take consumes one call of the failure armed for method; nil when none is.
func (m faults) take(method string) *failure {
	fl := m[method]
	if fl == nil {
		return nil
	}
	fl.n--
	if fl.n <= 0 {
		delete(m, method)
	}
	return fl
}

// knobs are the fault and pacing settings; guarded by their own mutex so
// that the interceptor never waits for an operation's completion.
type knobs struct {
	mu        sync.Mutex
	latency   map[string]time.Duration
	fails     faults
	drops     faults
	opFails   faults
	throttles []*throttle
	seen      []Request
	opDelay   time.Duration
	holdAll   bool
	held      map[string]bool
}

func newKnobs(opDelay time.Duration) knobs {
	return knobs{
		latency: map[string]time.Duration{},
		fails:   faults{},
		drops:   faults{},
		opFails: faults{},
		held:    map[string]bool{},
		opDelay: opDelay,
	}
}

// SetLatency delays every call of method by d before it is handled (0
// removes the delay). A call's deadline still applies.
func (f *Fake) SetLatency(method string, d time.Duration) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	if d <= 0 {
		delete(f.knobs.latency, method)
		return
	}
	f.knobs.latency[method] = d
}

// FailCalls makes the next n calls of method fail with code before they do
// anything (after authentication). n <= 0 clears it.
func (f *Fake) FailCalls(method string, code codes.Code, n int) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.fails.set(method, code, n)
}

// DropReplies makes the next n calls of method do their work and then
// lose the reply: the client gets Unavailable, as when the connection
// breaks after the API has acted (a mutation's operation runs on). n <= 0
// clears it.
func (f *Fake) DropReplies(method string, n int) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.drops.set(method, codes.Unavailable, n)
}

// lostReply consumes one DropReplies of method: the error the client gets
// instead of the reply, nil when the reply is not lost.
func (f *Fake) lostReply(method string) error {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	if fl := f.knobs.drops.take(method); fl != nil {
		return status.Errorf(fl.code, "injected: the reply of %s was lost", method)
	}
	return nil
}

// FailOperations makes the operations of the next n calls of method (a
// mutation) start and then fail with code: the operation completes with
// an error and what it reserved is released. n <= 0 clears it.
func (f *Fake) FailOperations(method string, code codes.Code, n int) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.opFails.set(method, code, n)
}

// Throttle answers calls with t.Code (default ResourceExhausted) as t says.
// Throttlings add up; Unthrottle ends them all.
func (f *Fake) Throttle(t Throttling) {
	if t.Code == codes.OK {
		t.Code = codes.ResourceExhausted
	}
	th := &throttle{Throttling: t, left: t.Calls}
	if t.For > 0 {
		th.until = time.Now().Add(t.For)
	}
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.throttles = append(f.knobs.throttles, th)
}

// Unthrottle ends every throttling.
func (f *Fake) Unthrottle() {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.throttles = nil
}

// Calls returns when each call of method arrived (all calls: also those
// refused by authentication, a fault or a throttling), oldest first.
// method "" returns the calls of every method.
func (f *Fake) Calls(method string) []time.Time {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	var out []time.Time
	for _, r := range f.knobs.seen {
		if method == "" || r.Method == method {
			out = append(out, r.At)
		}
	}
	return out
}

// Seen returns every request received so far, oldest first: method,
// metadata and body, for tests that look for secrets in what a client
// sends (and in what it must not log).
func (f *Fake) Seen() []Request {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	out := make([]Request, len(f.knobs.seen))
	for i, r := range f.knobs.seen {
		out[i] = r
		out[i].Metadata = r.Metadata.Copy()
		out[i].Body = append([]byte(nil), r.Body...)
	}
	return out
}

// SetOperationDelay sets how long operations started from now on run.
func (f *Fake) SetOperationDelay(d time.Duration) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.opDelay = max(d, 0)
}

// HoldOperations keeps the operations of the given methods (all methods
// when none is given) from completing, started or not, until
// ReleaseOperations.
func (f *Fake) HoldOperations(methods ...string) {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	if len(methods) == 0 {
		f.knobs.holdAll = true
	}
	for _, m := range methods {
		f.knobs.held[m] = true
	}
}

// ReleaseOperations ends every hold; the operations held complete at the
// next call (once their delay has passed).
func (f *Fake) ReleaseOperations() {
	f.knobs.mu.Lock()
	f.knobs.holdAll = false
	clear(f.knobs.held)
	f.knobs.mu.Unlock()
}

// SetQuota replaces the folder's quota. Disks already over it stay.
func (f *Fake) SetQuota(q Quota) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opts.Quota = q
}

// SetTokenTTL sets the lifetime of the tokens issued from now on.
func (f *Fake) SetTokenTTL(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opts.TokenTTL = d
}

// SetGrowAttached sets Options.GrowAttached.
func (f *Fake) SetGrowAttached(ok bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opts.GrowAttached = ok
}

func (f *Fake) held(method string) bool {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	return f.knobs.holdAll || f.knobs.held[method]
}

func (f *Fake) opDelay() time.Duration {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	return f.knobs.opDelay
}

// takeOpFailure consumes one FailOperations of method; nil when none.
func (f *Fake) takeOpFailure(method string) *status.Status {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	if fl := f.knobs.opFails.take(method); fl != nil {
		return status.Newf(fl.code, "injected operation failure of %s", method)
	}
	return nil
}

// intercept runs before every call: it records the call, settles the
// operations due, applies latency, authentication, injected failures and
// throttling, then hands over to the handler.
func (f *Fake) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	method := info.FullMethod
	latency := f.record(ctx, method, req)
	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		case <-f.ctx.Done():
			t.Stop()
			return nil, status.Error(codes.Unavailable, "yandexfake: closing")
		}
	}
	f.settle()
	if isAPI(method) {
		if err := f.authenticate(ctx); err != nil {
			return nil, err
		}
	}
	if err := f.fault(method); err != nil {
		return nil, err
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := f.lostReply(method); err != nil {
		return nil, err
	}
	return resp, nil
}

// record logs the call (Calls, Seen) and returns its latency.
func (f *Fake) record(ctx context.Context, method string, req any) time.Duration {
	md, _ := metadata.FromIncomingContext(ctx)
	var body []byte
	if m, ok := req.(proto.Message); ok {
		body, _ = protojson.Marshal(m)
	}
	now := time.Now()
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	f.knobs.seen = append(f.knobs.seen, Request{Method: method, At: now, Metadata: md.Copy(), Body: body})
	return f.knobs.latency[method]
}

// fault returns the injected failure or throttling answer of a call, if
// any, consuming it.
func (f *Fake) fault(method string) error {
	f.knobs.mu.Lock()
	defer f.knobs.mu.Unlock()
	if fl := f.knobs.fails.take(method); fl != nil {
		return status.Errorf(fl.code, "injected failure of %s", method)
	}
	now := time.Now()
	live := f.knobs.throttles[:0]
	var err error
	for _, t := range f.knobs.throttles {
		if !t.until.IsZero() && !now.Before(t.until) {
			continue // expired
		}
		if err == nil && (t.Method == method || (t.Method == "" && isAPI(method))) {
			err = status.Errorf(t.Code, "throttled: too many requests to %s", method)
			if t.Calls > 0 {
				t.left--
				if t.left <= 0 {
					continue // used up
				}
			}
		}
		live = append(live, t)
	}
	f.knobs.throttles = live
	return err
}
