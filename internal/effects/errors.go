package effects

import (
	"context"
	"errors"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/ops"
	"github.com/csid-dev/csid/internal/store"
)

// kindOf gives an error of the provider or of the host the engine's kind
// for it: the one place where cloud and mounter errors become kinds (the
// engine maps kinds to gRPC codes). An error that already has a kind (an
// executor's own ops.Errorf or ops.Mark) keeps it; one this function does
// not know keeps none (the engine treats it as internal).
func kindOf(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := ops.GivenKind(err); ok {
		return err
	}
	for _, m := range kindTable {
		if errors.Is(err, m.err) {
			return ops.Mark(err, m.kind)
		}
	}
	return err
}

// kindTable maps the sentinel errors of the layers below to kinds, in
// order: the first match wins.
var kindTable = []struct {
	err  error
	kind ops.Kind
}{
	{cloud.ErrTransient, ops.Transient},
	{cloud.ErrInUse, ops.Transient},
	{mounter.ErrInUse, ops.Transient},
	{store.ErrUnavailable, ops.Transient},
	{context.DeadlineExceeded, ops.Transient},
	{cloud.ErrNotFound, ops.NotFound},
	{cloud.ErrAlreadyExists, ops.Exists},
	{cloud.ErrAttached, ops.Conflict},
	{cloud.ErrLimitReached, ops.Exhausted},
	{cloud.ErrInvalid, ops.Invalid},
	{cloud.ErrNotSupported, ops.Conflict},
	{cloud.ErrIdentity, ops.Conflict},
	{mounter.ErrInvalidPath, ops.Invalid},
	{mounter.ErrSymlink, ops.Invalid},
	{mounter.ErrFormatMismatch, ops.Conflict},
	{mounter.ErrBusy, ops.Conflict},
	{mounter.ErrPathConflict, ops.Conflict},
	{mounter.ErrNotMounted, ops.NotFound},
	{mounter.ErrProbeFailed, ops.Internal},
}

// kinded wraps executors so that every error they return carries its kind.
func kinded(execs map[fsm.Event]ops.Executor) map[fsm.Event]ops.Executor {
	out := make(map[fsm.Event]ops.Executor, len(execs))
	for e, x := range execs {
		out[e] = kindedExec{x}
	}
	return out
}

type kindedExec struct{ x ops.Executor }

func (k kindedExec) Execute(ctx context.Context, x *ops.Exec) (ops.Result, error) {
	res, err := k.x.Execute(ctx, x)
	return res, kindOf(err)
}

func (k kindedExec) Compensate(ctx context.Context, x *ops.Exec) error {
	return kindOf(k.x.Compensate(ctx, x))
}
