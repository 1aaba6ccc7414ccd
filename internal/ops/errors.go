package ops

import (
	"context"
	"errors"
	"fmt"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/mounter"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Error is an outcome to report to the caller with a gRPC code. It
// implements GRPCStatus, so a gRPC handler may return it as it is.
type Error struct {
	Code codes.Code
	Msg  string
}

func (e *Error) Error() string { return e.Msg }

// GRPCStatus makes status.FromError and status.Code see the code.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Msg) }

// Errorf builds an Error.
func Errorf(code codes.Code, format string, args ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...)}
}

// Retryable marks an executor error as transient: the engine retries the
// op with backoff instead of failing it.
func Retryable(err error) error { return retryable{err} }

type retryable struct{ error }

func (r retryable) Unwrap() error { return r.error }

// classify is the one place where the errors of the layers below (cloud,
// mounter, executors) become gRPC codes, and where csid decides what is
// worth retrying.
func classify(err error) (code codes.Code, transient bool) {
	var oe *Error
	var r retryable
	switch {
	case errors.As(err, &oe):
		return oe.Code, errors.As(err, &r)
	case errors.As(err, &r), errors.Is(err, cloud.ErrTransient), errors.Is(err, mounter.ErrInUse):
		return codes.Unavailable, true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return codes.Aborted, false
	case errors.Is(err, cloud.ErrNotFound):
		return codes.NotFound, false
	case errors.Is(err, cloud.ErrAlreadyExists):
		return codes.AlreadyExists, false
	case errors.Is(err, cloud.ErrAttached):
		return codes.FailedPrecondition, false
	case errors.Is(err, cloud.ErrLimitReached):
		return codes.ResourceExhausted, false
	case errors.Is(err, cloud.ErrInvalid):
		return codes.InvalidArgument, false
	case errors.Is(err, mounter.ErrInvalidPath):
		return codes.InvalidArgument, false
	case errors.Is(err, mounter.ErrFormatMismatch), errors.Is(err, mounter.ErrBusy):
		return codes.FailedPrecondition, false
	case errors.Is(err, mounter.ErrNotMounted):
		return codes.NotFound, false
	case errors.Is(err, mounter.ErrProbeFailed):
		return codes.Internal, false
	default:
		return codes.Internal, false
	}
}

// asError turns any executor error into the Error a caller sees.
func asError(err error) *Error {
	var oe *Error
	if errors.As(err, &oe) {
		return oe
	}
	code, _ := classify(err)
	return &Error{Code: code, Msg: err.Error()}
}

// ErrClosed is returned by Submit once the engine is shutting down.
var ErrClosed = Errorf(codes.Unavailable, "csid is shutting down; retry")

// ErrNotReady is returned by Submit before recovery has finished.
var ErrNotReady = Errorf(codes.Unavailable, "csid is recovering its operations; retry")
