package yandex

import (
	"context"
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/csid-dev/csid/internal/cloud"
)

func quotaErr() error {
	st, _ := status.New(codes.ResourceExhausted, "over the folder's disk quota").WithDetails(
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: "compute.disks.size"}}})
	return st.Err()
}

func TestAPIErrorsMapToCloudErrors(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want error
	}{
		{status.Error(codes.NotFound, "no disk"), cloud.ErrNotFound},
		{status.Error(codes.AlreadyExists, "name taken"), cloud.ErrAlreadyExists},
		{status.Error(codes.InvalidArgument, "bad size"), cloud.ErrInvalid},
		{status.Error(codes.OutOfRange, "too big"), cloud.ErrInvalid},
		{status.Error(codes.FailedPrecondition, "disk is busy"), cloud.ErrTransient},
		{quotaErr(), cloud.ErrLimitReached},
		{status.Error(codes.ResourceExhausted, "throttled: too many requests"), cloud.ErrTransient},
		{status.Error(codes.Unavailable, "connection refused"), cloud.ErrTransient},
		{status.Error(codes.DeadlineExceeded, "slow"), cloud.ErrTransient},
		{status.Error(codes.Internal, "oops"), cloud.ErrTransient},
		{context.Canceled, context.Canceled},
	} {
		got := apiError(tc.err, "call")
		if !errors.Is(got, tc.want) {
			t.Errorf("apiError(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	for _, code := range []codes.Code{codes.Unauthenticated, codes.PermissionDenied} {
		got := apiError(status.Error(code, "no"), "call")
		for _, typed := range []error{cloud.ErrTransient, cloud.ErrNotFound, cloud.ErrInvalid} {
			if errors.Is(got, typed) {
				t.Errorf("%s maps to %v; credentials problems are not typed", code, typed)
			}
		}
	}
}

// The interceptor retries only what the API refused for load, each retry
// after a growing pause and through the limiter, and gives up after
// maxAttempts.
func TestThrottleRetriesOnlyLoadRefusals(t *testing.T) {
	for _, tc := range []struct {
		err   error
		tries int
	}{
		{status.Error(codes.ResourceExhausted, "throttled"), 4},
		{status.Error(codes.Unavailable, "down"), 4},
		{quotaErr(), 1},
		{status.Error(codes.FailedPrecondition, "busy"), 1},
		{status.Error(codes.NotFound, "gone"), 1},
		{nil, 1},
	} {
		th := newThrottle(1000, 1000, 4)
		var pauses []time.Duration
		th.sleep = func(_ context.Context, d time.Duration) error { pauses = append(pauses, d); return nil }
		tries := 0
		invoke := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			tries++
			return tc.err
		}
		err := th.unary(context.Background(), "/m", nil, nil, nil, invoke)
		if tries != tc.tries || err != tc.err || len(pauses) != tc.tries-1 {
			t.Errorf("%v: %d tries, %d pauses, error %v; want %d tries, a pause between two, the last error", tc.err, tries, len(pauses), err, tc.tries)
		}
		for i, p := range pauses {
			ceil := min(th.base<<i, th.max)
			if p < ceil/2 || p > ceil {
				t.Errorf("%v: pause %d is %v, want in [%v, %v]", tc.err, i, p, ceil/2, ceil)
			}
		}
	}
}
