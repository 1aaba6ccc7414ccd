package view_test

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
	"github.com/csid-dev/csid/internal/view/viewtest"
)

func fixture(t *testing.T) *view.StoreSource {
	t.Helper()
	path := filepath.Join(t.TempDir(), "csid.db")
	if err := viewtest.Build(path); err != nil {
		t.Fatal(err)
	}
	st, err := store.OpenReadOnly(path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return view.NewStoreSource(st, view.Info{Mode: "all", StateFile: path})
}

func ids(l view.VolumeList) []string {
	var out []string
	for _, v := range l.Volumes {
		out = append(out, v.ID)
	}
	return out
}

func seqs(l view.OpList) []uint64 {
	var out []uint64
	for _, o := range l.Ops {
		out = append(out, o.Seq)
	}
	return out
}

func TestFilters(t *testing.T) {
	src, ctx := fixture(t), context.Background()
	vols := func(f view.VolumeFilter) []string {
		t.Helper()
		l, err := src.Volumes(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return ids(l)
	}
	if got := vols(view.VolumeFilter{}); len(got) != 6 || !slices.IsSorted(got) {
		t.Errorf("all volumes, in id order: %v", got)
	}
	if got := vols(view.VolumeFilter{State: fsm.Created}); !slices.Equal(got, []string{viewtest.Created, viewtest.Failed, viewtest.Retrying, viewtest.Restored}) {
		t.Errorf("CREATED: %v", got)
	}
	if got := vols(view.VolumeFilter{Node: "node-1"}); !slices.Equal(got, []string{viewtest.Published}) {
		t.Errorf("on node-1: %v", got)
	}
	if got := vols(view.VolumeFilter{State: fsm.Absent}); !slices.Equal(got, []string{viewtest.Creating}) {
		t.Errorf("ABSENT (a create in flight): %v", got)
	}
	if _, err := src.Volumes(ctx, view.VolumeFilter{State: "BROKEN"}); err == nil {
		t.Error("an unknown state is accepted")
	}

	ops := func(f view.OpFilter) []uint64 {
		t.Helper()
		l, err := src.Ops(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		return seqs(l)
	}
	if got := ops(view.OpFilter{}); !slices.Equal(got, []uint64{14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}) {
		t.Errorf("all ops, newest first: %v", got)
	}
	if got := ops(view.OpFilter{Status: view.OpsPending}); !slices.Equal(got, []uint64{13, 11, 10}) {
		t.Errorf("pending: %v", got)
	}
	if got := ops(view.OpFilter{Status: view.OpsPending, Limit: 1}); !slices.Equal(got, []uint64{13}) {
		t.Errorf("pending, limit 1: %v", got)
	}
	if got := ops(view.OpFilter{Status: view.OpsFailed}); !slices.Equal(got, []uint64{8}) {
		t.Errorf("failed: %v", got)
	}
	if got := ops(view.OpFilter{VolumeID: viewtest.Published, Limit: 2}); !slices.Equal(got, []uint64{6, 5}) {
		t.Errorf("of one volume, limit 2: %v", got)
	}
	if got := ops(view.OpFilter{SnapshotID: viewtest.Snapshot}); !slices.Equal(got, []uint64{12}) {
		t.Errorf("of one snapshot: %v", got)
	}
	if _, err := src.Ops(ctx, view.OpFilter{Status: "odd"}); err == nil {
		t.Error("an unknown op status is accepted")
	}
}

func TestVolumeDetail(t *testing.T) {
	src, ctx := fixture(t), context.Background()
	v, err := src.Volume(ctx, viewtest.Published)
	if err != nil {
		t.Fatal(err)
	}
	if v.StagingPath != viewtest.StagingPath || len(v.Targets) != 2 || !v.Targets[1].ReadOnly || v.Device != "/dev/loop3" {
		t.Errorf("staging and targets: %+v", v)
	}
	if r := v.Resize; r == nil || r.Status != view.ResizeQueued || r.CurrentBytes != 1<<30 || r.Node != "node-1" || r.VolumeState != fsm.Published {
		t.Errorf("resize: %+v", v.Resize)
	}
	if len(v.History) != 6 || v.History[4].Op != 6 || v.History[5].Event != fsm.Expand || v.History[5].Guard != fsm.Deferred {
		t.Errorf("history: %+v", v.History)
	}
	for _, h := range v.History {
		if h.Time.Location().String() != "UTC" {
			t.Errorf("a history time not in UTC: %v", h.Time)
		}
	}
	if _, err := src.Volume(ctx, "vol-none"); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown volume: %v", err)
	}
	if _, err := src.Op(ctx, 99); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown op: %v", err)
	}
	op, err := src.Op(ctx, 8)
	if err != nil || op.Code != "ResourceExhausted" || op.From != fsm.Created || op.Pending() {
		t.Errorf("op 8: %+v, %v", op, err)
	}
}

// TestSnapshots: the snapshots are listed in id order, the one being cut
// with its pending op; one snapshot comes with its history; a volume
// restored from a snapshot names it as its source.
func TestSnapshots(t *testing.T) {
	src, ctx := fixture(t), context.Background()
	l, err := src.Snapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Snapshots) != 2 || l.Snapshots[0].ID != viewtest.Snapshot || l.Snapshots[1].ID != viewtest.Cutting {
		t.Fatalf("snapshots: %+v", l.Snapshots)
	}
	if s := l.Snapshots[1]; s.State != fsm.Absent || s.PendingOp == nil || s.PendingOp.Event != fsm.SnapshotCreate || s.PendingOp.SnapshotID != viewtest.Cutting {
		t.Errorf("the snapshot being cut: %+v", s)
	}
	s, err := src.Snapshot(ctx, viewtest.Snapshot)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != fsm.Ready || !s.ReadyToUse || s.SizeBytes != 1<<30 || s.SourceVolumeID != viewtest.Created || s.LastOp == nil ||
		len(s.History) != 1 || s.History[0].Event != fsm.SnapshotCreate || s.History[0].To != fsm.Ready {
		t.Errorf("snapshot: %+v", s)
	}
	if _, err := src.Snapshot(ctx, "snap-none"); !errors.Is(err, view.ErrNotFound) {
		t.Errorf("unknown snapshot: %v", err)
	}
	v, err := src.Volume(ctx, viewtest.Restored)
	if err != nil || v.Source == nil || v.Source.SnapshotID != viewtest.Snapshot {
		t.Errorf("restored volume: %+v, %v", v.Source, err)
	}
	if h, err := src.Volume(ctx, viewtest.Created); err != nil || len(h.History) != 1 {
		t.Errorf("the snapshot's op is in its source volume's history: %+v, %v", h.History, err)
	}
}
