package drill

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/fsm"
	"github.com/csid-dev/csid/internal/hostscrub"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/store"
	"github.com/csid-dev/csid/internal/view"
)

// verify checks a cell's invariants once its scenario has ended and csid
// has stopped: the state file (read-only), the cloud and the host. The
// refused ops are the failures the scenario asked for; snapshots says the
// scenario took snapshots (then the provider's must be read, and none
// left).
func verify(ctx context.Context, dir string, cc *CellCloud, refused []refusal, snapshots bool) error {
	var problems []string
	add := func(format string, args ...any) { problems = append(problems, fmt.Sprintf(format, args...)) }

	st, err := store.OpenReadOnly(filepath.Join(dir, "csid.db"), store.Options{})
	if err != nil {
		return err
	}
	defer st.Close()
	if err := checkRecords(st, refused, add); err != nil {
		return err
	}

	// A growth record left says a filesystem's growth never finished.
	if left, _ := filepath.Glob(filepath.Join(dir, app.GrowDir, "*")); len(left) > 0 {
		add("growth records left: %s", strings.Join(left, ", "))
	}

	// Leaks: what csid check would report, on the stopped driver's state
	// file, the cell's cloud (freeze records only the local backend keeps)
	// and the host.
	insp, err := cc.Inspect(ctx)
	if err != nil {
		return err
	}
	var freezes func() ([]check.Freeze, error)
	if l, ok := insp.(*local.Inspector); ok {
		freezes = check.LocalFreezes(l)
	}
	in, err := check.Gather(ctx, check.Sources{
		Records:     []check.RecordSource{{Name: "csid.db", Mode: string(driver.ModeAll), Source: view.NewStoreSource(st, view.Info{Mode: string(driver.ModeAll)})}},
		Cloud:       insp,
		Freezes:     freezes,
		Mounts:      mounter.New(),
		HostNodes:   []string{NodeID},
		DriverName:  driver.DefaultName,
		KubeletRoot: filepath.Join(dir, "kubelet"),
	})
	if err != nil {
		return err
	}
	for _, f := range check.Compare(in).Findings {
		add("%s: %s", f.Kind, f.Problem)
	}
	// And since the scenario brought everything down, nothing at all may be
	// left in the cloud, even what a record would explain.
	for _, d := range in.Disks {
		add("disk %s (%s) is left in the cloud, attached to %q", d.ID, d.Name, d.AttachedTo)
	}
	for _, s := range in.Snapshots {
		add("snapshot %s (%s) is left at the provider", s.ID, s.Name)
	}
	if snapshots && !in.SnapshotsRead {
		add("the local backend's snapshots could not be read (its inspector lists none): leaks of snapshots are not checked")
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s", strings.Join(problems, "; "))
	}
	return nil
}

// checkRecords checks the stopped csid's records: no op left in flight, no
// volume, snapshot or resize left, and every op a legal step (checkOps).
func checkRecords(st *store.Store, refused []refusal, add func(string, ...any)) error {
	return st.View(func(tx *store.Tx) error {
		active, err := tx.ActiveOps()
		if err != nil {
			return err
		}
		for _, op := range active {
			add("op %d (%s of %s) is still %s", op.Seq, op.Event, op.Subject(), op.Status)
		}
		err = tx.ForEachVolume("", func(v *store.Volume) bool {
			add("volume %s is left in state %s", v.ID, v.State)
			return true
		})
		if err != nil {
			return err
		}
		err = tx.ForEachSnapshot("", func(s *store.Snapshot) bool {
			add("snapshot %s is left in state %s", s.ID, s.State)
			return true
		})
		if err != nil {
			return err
		}
		err = tx.ForEachResize(func(r *store.Resize) bool {
			add("a resize of %s to %d bytes is left %s", r.VolumeID, r.TargetBytes, r.Status)
			return true
		})
		if err != nil {
			return err
		}
		var ops []*store.Op
		if err := tx.ForEachOp(func(op *store.Op) bool { ops = append(ops, op); return true }); err != nil {
			return err
		}
		slices.Reverse(ops) // oldest first
		checkOps(ops, refused, add)
		return nil
	})
}

// refusal is an op a scenario expects to fail, with the code it fails
// with (a gRPC code's name).
type refusal struct {
	volumeID string
	event    fsm.Event
	code     string
}

// checkOps checks the ops of every volume and snapshot, oldest first: each
// succeeded (or is one of the refusals the scenario asked for) and was a
// legal transition of its lifecycle from the state the previous one left;
// and no attach was accepted before an earlier resize of its volume had
// finished.
func checkOps(ops []*store.Op, refused []refusal, add func(string, ...any)) {
	state := map[string]fsm.State{}
	resizes := map[string][]*store.Op{}
	for _, op := range ops {
		id := op.Subject()
		if op.Status == store.OpFailed && slices.Contains(refused, refusal{op.VolumeID, op.Event, op.Code}) {
			continue
		}
		if op.Status != store.OpSucceeded {
			add("op %d (%s of %s) %s: %s", op.Seq, op.Event, id, op.Status, op.Message)
			continue
		}
		if step, err := op.Lifecycle().Next(op.From, op.Event, op.Guard); err != nil || step.To != op.To {
			add("op %d (%s of %s) is not a legal transition: %s -> %s", op.Seq, op.Event, id, op.From, op.To)
		}
		if prev, ok := state[id]; ok && prev != op.From {
			add("op %d (%s of %s) starts from %s, but it was left %s", op.Seq, op.Event, id, op.From, prev)
		}
		state[id] = op.To
		switch op.Event {
		case fsm.Expand:
			resizes[op.VolumeID] = append(resizes[op.VolumeID], op)
		case fsm.ControllerPublish:
			for _, r := range resizes[op.VolumeID] {
				if r.FinishedAt.After(op.CreatedAt) {
					add("op %d attached %s at %v, before its resize (op %d) finished at %v", op.Seq, op.VolumeID, op.CreatedAt, r.Seq, r.FinishedAt)
				}
			}
		}
	}
}

// scrub releases what a cell may have left in the kernel and removes its
// dir, unless keep is set (a failing cell's files are kept for inspection).
func scrub(dir string, keep bool) {
	hostscrub.Scrub(context.Background(), dir)
	if !keep {
		_ = os.RemoveAll(dir)
	}
}
