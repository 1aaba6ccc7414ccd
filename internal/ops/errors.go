package ops

import (
	"context"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/store"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Kind is what a failed outcome means, in the engine's own terms. The
// planner answers with kinds, executors report their failures as kinds
// (internal/effects translates the provider's and the host's errors), and
// Kind.Code alone turns a kind into the gRPC code a caller sees.
type Kind string

// The kinds of failure.
const (
	// Internal: a failure nothing above can act on (a bug, an unknown
	// error). The default for an error of no kind.
	Internal Kind = "internal"
	// Transient: may pass; the engine retries it with backoff, and
	// answers it as "unavailable, retry" when it gives up.
	Transient Kind = "transient"
	// Invalid: an argument is malformed or unsupported.
	Invalid Kind = "invalid"
	// NotFound: the volume, node or path does not exist.
	NotFound Kind = "not_found"
	// Exists: the name or slot is taken by an object with other
	// arguments.
	Exists Kind = "exists"
	// Conflict: not possible in the volume's current state (attached
	// elsewhere, not staged, in use): the caller must change something
	// first.
	Conflict Kind = "conflict"
	// Busy: another operation is in the way, or the caller's deadline came
	// before the outcome; retry with the same arguments.
	Busy Kind = "busy"
	// Exhausted: no capacity or attach slot left.
	Exhausted Kind = "exhausted"
	// OutOfRange: a size the volume cannot take (a shrink, or beyond what
	// the backend can hold).
	OutOfRange Kind = "out_of_range"
	// Unsupported: this csid does not serve the request (its mode).
	Unsupported Kind = "unsupported"
	// Damaged: a stored record failed its integrity check; it is never
	// acted on.
	Damaged Kind = "damaged"
)

// Code is the one mapping from the engine's kinds to gRPC codes.
func (k Kind) Code() codes.Code {
	switch k {
	case Transient:
		return codes.Unavailable
	case Invalid:
		return codes.InvalidArgument
	case NotFound:
		return codes.NotFound
	case Exists:
		return codes.AlreadyExists
	case Conflict:
		return codes.FailedPrecondition
	case Busy:
		return codes.Aborted
	case Exhausted:
		return codes.ResourceExhausted
	case OutOfRange:
		return codes.OutOfRange
	case Unsupported:
		return codes.Unimplemented
	case Damaged:
		return codes.DataLoss
	default:
		return codes.Internal
	}
}

// kinds lists every kind, for kindOfCode.
var kinds = []Kind{Internal, Transient, Invalid, NotFound, Exists, Conflict, Busy, Exhausted, OutOfRange, Unsupported, Damaged}

// kindOfCode reads back the kind of a failure stored as its gRPC code's
// name (op records keep the code an operator knows), through Code.
func kindOfCode(name string) Kind {
	for _, k := range kinds {
		if k.Code().String() == name {
			return k
		}
	}
	return Internal
}

// Error is an outcome with its kind, as a caller gets it. It implements
// GRPCStatus, so a gRPC handler may return it as it is.
type Error struct {
	Kind Kind
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// GRPCStatus makes status.FromError and status.Code see the kind's code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Kind.Code(), e.Msg) }

// Errorf builds an Error of kind k.
func Errorf(k Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Msg: fmt.Sprintf(format, args...)}
}

// Mark gives err the kind k, keeping it in the chain (errors.Is and As still
// see it) and its message unchanged. Executors mark what they return.
func Mark(err error, k Kind) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, kind: k}
}

type marked struct {
	err  error
	kind Kind
}

func (m *marked) Error() string { return m.err.Error() }
func (m *marked) Unwrap() error { return m.err }

// KindOf is the kind of an error: the outermost kind given to it (an
// *Error, or Mark), else what the engine itself knows of (a store that
// cannot write is transient; an ended context means "busy, retry"), else
// Internal.
func KindOf(err error) Kind {
	if err == nil {
		return ""
	}
	if k, ok := givenKind(err); ok {
		return k
	}
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return Transient
	case errors.Is(err, store.ErrDamaged):
		return Damaged
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return Busy
	default:
		return Internal
	}
}

// GivenKind returns the kind given to err (the outermost *Error or Mark in
// its chain, depth first as errors.As searches), if any: an executor that
// translates other errors leaves one that has a kind as it is.
func GivenKind(err error) (Kind, bool) { return givenKind(err) }

func givenKind(err error) (Kind, bool) {
	switch e := err.(type) {
	case *Error:
		return e.Kind, true
	case *marked:
		return e.kind, true
	case interface{ Unwrap() error }:
		if inner := e.Unwrap(); inner != nil {
			return givenKind(inner)
		}
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if k, ok := givenKind(inner); ok {
				return k, true
			}
		}
	}
	return "", false
}

// asError turns any error into the Error a caller sees: itself if it is
// one, else its message with its kind.
func asError(err error) *Error {
	if oe, ok := err.(*Error); ok {
		return oe
	}
	return &Error{Kind: KindOf(err), Msg: err.Error()}
}

// storeError is the answer of a request whose records could not be read.
// A damaged record is DataLoss, naming it: csid does not act on the volume
// until the record is restored (the answer is the same on every retry).
func storeError(req Request, err error) *Error {
	who := req.subject()
	switch a := req.Args.(type) {
	case *CreateArgs:
		who = fmt.Sprintf("volume name %q", a.Name)
	case *SnapshotCreateArgs:
		who = fmt.Sprintf("snapshot name %q", a.Name)
	}
	return readError(fmt.Sprintf("%s: %s", who, req.Event), err)
}

// readError is the answer of a read of the records (what says what was
// read) that failed with err.
func readError(what string, err error) *Error {
	var d *store.DamagedError
	if errors.As(err, &d) {
		return Errorf(Damaged, "%s: csid does not act on a damaged record: %v; "+
			"csid check says what to do (docs/operations.md, \"A damaged record\")", what, d)
	}
	return Errorf(KindOf(err), "%s: %v", what, err)
}

// ErrClosed is returned by Submit once the engine is shutting down.
var ErrClosed = Errorf(Transient, "csid is shutting down; retry")

// ErrNotReady is returned by Submit before recovery has finished.
var ErrNotReady = Errorf(Transient, "csid is recovering its operations; retry")
