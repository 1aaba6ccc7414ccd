package yandex

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csid-dev/csid/internal/cloud"
)

// apiError maps an error of a call to the Yandex API (what names the call
// and its object) to csid's typed errors, in one place:
//
//	NotFound                          -> ErrNotFound
//	AlreadyExists                     -> ErrAlreadyExists
//	InvalidArgument, OutOfRange       -> ErrInvalid
//	FailedPrecondition                -> ErrTransient: the disk is busy (an
//	                                     operation in flight, not ready);
//	                                     where it is refused for being
//	                                     attached, Cloud.refused makes it
//	                                     ErrAttached
//	ResourceExhausted of a quota      -> ErrLimitReached
//	ResourceExhausted (throttling),
//	Unavailable, DeadlineExceeded,
//	Aborted, Internal, Unknown        -> ErrTransient (the interceptor has
//	                                     already backed off and retried the
//	                                     first two)
//	Unauthenticated, PermissionDenied -> untyped: a credentials or
//	                                     permission problem retrying does not
//	                                     cure
//
// The context's own errors pass through unchanged.
func apiError(err error, what string) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return fmt.Errorf("yandex: %s: %w", what, err)
	}
	var kind error
	switch st.Code() {
	case codes.OK:
		return nil
	case codes.Canceled:
		return fmt.Errorf("yandex: %s: %s: %w", what, st.Message(), context.Canceled)
	case codes.NotFound:
		kind = cloud.ErrNotFound
	case codes.AlreadyExists:
		kind = cloud.ErrAlreadyExists
	case codes.InvalidArgument, codes.OutOfRange:
		kind = cloud.ErrInvalid
	case codes.FailedPrecondition:
		kind = cloud.ErrTransient
	case codes.ResourceExhausted:
		kind = cloud.ErrTransient
		if isQuota(st) {
			kind = cloud.ErrLimitReached
		}
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.Internal, codes.Unknown:
		kind = cloud.ErrTransient
	default:
		return fmt.Errorf("yandex: %s: %s (%s)", what, st.Message(), st.Code())
	}
	return fmt.Errorf("yandex: %s: %s (%s): %w", what, st.Message(), st.Code(), kind)
}

// isQuota tells a ResourceExhausted of a quota (the folder or cloud has no
// room for the disk: retrying does not help) from throttling: by a
// google.rpc.QuotaFailure detail, or a message that names the quota, as
// Yandex's do ("Quota limit ... exceeded").
func isQuota(st *status.Status) bool {
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.QuotaFailure); ok {
			return true
		}
	}
	return strings.Contains(strings.ToLower(st.Message()), "quota")
}

// throttled reports whether code is one the interceptor backs off and
// retries: the API refused the call without acting on it, or could not be
// reached.
func throttled(err error) bool {
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch st.Code() {
	case codes.ResourceExhausted:
		return !isQuota(st)
	case codes.Unavailable:
		return true
	}
	return false
}
