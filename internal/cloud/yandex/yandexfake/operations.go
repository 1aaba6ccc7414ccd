package yandexfake

import (
	"context"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"
)

// effect is what an operation does on a simulated node when it completes
// (a loop device bound or released, an image grown). It runs outside f.mu.
type effect func(ctx context.Context) error

// opState is an operation.
type opState struct {
	pb     *operation.Operation
	method string
	due    time.Time
	// fail, when set, is the status the operation completes with instead of
	// applying.
	fail *status.Status
	// apply makes the change at completion and returns the response and
	// the node effects; undo releases what the start reserved when the
	// operation fails instead. Both run under f.mu.
	apply func() (proto.Message, []effect)
	undo  func()
	// disk is the disk the operation keeps busy until it is done (and
	// lists among the disk's operations); nil for none.
	disk *diskState
}

// opSpec is what a mutation hands startOp.
type opSpec struct {
	method      string
	description string
	metadata    proto.Message
	disk        *diskState
	apply       func() (proto.Message, []effect)
	undo        func()
}

// idempotent returns the operation an earlier call of method with the
// same "idempotency-key" started, or nil. Callers hold f.mu.
func (f *Fake) idempotent(ctx context.Context, method string) *operation.Operation {
	key := idempotencyKey(ctx)
	if key == "" {
		return nil
	}
	if op := f.idem[method+"\x00"+key]; op != nil {
		return proto.Clone(op.pb).(*operation.Operation)
	}
	return nil
}

func idempotencyKey(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get("idempotency-key"); len(v) > 0 {
		return v[0]
	}
	return ""
}

// startOp starts an operation and returns it as the call answers it
// (done=false). Callers hold f.mu.
func (f *Fake) startOp(ctx context.Context, spec opSpec) (*operation.Operation, error) {
	md, err := anypb.New(spec.metadata)
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	now := time.Now()
	op := &opState{
		pb: &operation.Operation{
			Id:          f.newID("fho"),
			Description: spec.description,
			CreatedAt:   timestamppb.New(now),
			CreatedBy:   "yandexfake",
			ModifiedAt:  timestamppb.New(now),
			Metadata:    md,
		},
		method: spec.method,
		due:    now.Add(f.opDelay()),
		fail:   f.takeOpFailure(spec.method),
		apply:  spec.apply,
		undo:   spec.undo,
		disk:   spec.disk,
	}
	if spec.disk != nil {
		spec.disk.busy = op
	}
	f.ops[op.pb.Id] = op
	f.pending = append(f.pending, op)
	if key := idempotencyKey(ctx); key != "" {
		f.idem[spec.method+"\x00"+key] = op
	}
	return proto.Clone(op.pb).(*operation.Operation), nil
}

// settle completes the operations that are due and not held: it applies
// them, runs their node effects, then marks them done.
func (f *Fake) settle() {
	f.settleMu.Lock()
	defer f.settleMu.Unlock()
	now := time.Now()
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return
	}
	var due []*opState
	rest := f.pending[:0]
	for _, op := range f.pending {
		if !now.Before(op.due) && !f.held(op.method) {
			due = append(due, op)
		} else {
			rest = append(rest, op)
		}
	}
	clear(f.pending[len(rest):])
	f.pending = rest
	if len(due) == 0 {
		f.mu.Unlock()
		return
	}
	responses := make([]proto.Message, len(due))
	effects := make([][]effect, len(due))
	for i, op := range due {
		if op.fail != nil {
			if op.undo != nil {
				op.undo()
			}
			continue
		}
		responses[i], effects[i] = op.apply()
	}
	f.mu.Unlock()

	failed := make([]error, len(due))
	for i := range due {
		for _, e := range effects[i] {
			if err := e(f.ctx); err != nil && failed[i] == nil {
				failed[i] = err
			}
		}
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	for i, op := range due {
		f.finish(op, responses[i], failed[i])
	}
}

// finish marks op done with its response or error. Callers hold f.mu.
func (f *Fake) finish(op *opState, resp proto.Message, effectErr error) {
	op.pb.Done = true
	op.pb.ModifiedAt = timestamppb.Now()
	switch {
	case op.fail != nil:
		op.pb.Result = &operation.Operation_Error{Error: op.fail.Proto()}
	case effectErr != nil:
		st := status.Newf(codes.Internal, "node simulator: %v", effectErr)
		op.pb.Result = &operation.Operation_Error{Error: st.Proto()}
	default:
		a, err := anypb.New(resp)
		if err != nil {
			op.pb.Result = &operation.Operation_Error{Error: status.New(codes.Internal, err.Error()).Proto()}
			break
		}
		op.pb.Result = &operation.Operation_Response{Response: a}
	}
	if op.disk != nil && op.disk.busy == op {
		op.disk.busy = nil
	}
}

// ForgetOperations drops every finished operation, as the API forgets
// old ones: OperationService.Get of them is NotFound from now on (and
// their idempotency keys start new operations). Operations in flight are
// kept.
func (f *Fake) ForgetOperations() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, op := range f.ops {
		if op.pb.Done {
			delete(f.ops, id)
		}
	}
	for k, op := range f.idem {
		if op.pb.Done {
			delete(f.idem, k)
		}
	}
}

type operationService struct {
	operation.UnimplementedOperationServiceServer
	f *Fake
}

// Get reports an operation.
func (s operationService) Get(_ context.Context, req *operation.GetOperationRequest) (*operation.Operation, error) {
	if err := checkID("operation_id", req.GetOperationId()); err != nil {
		return nil, err
	}
	s.f.mu.Lock()
	defer s.f.mu.Unlock()
	op, ok := s.f.ops[req.GetOperationId()]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "operation %s not found", req.GetOperationId())
	}
	return proto.Clone(op.pb).(*operation.Operation), nil
}

// checkID validates a required id field as the API does.
func checkID(field, id string) error {
	switch {
	case id == "":
		return status.Errorf(codes.InvalidArgument, "%s is required", field)
	case len(id) > maxIDLen:
		return status.Errorf(codes.InvalidArgument, "%s: the length must be less than or equal to %d", field, maxIDLen)
	}
	return nil
}
