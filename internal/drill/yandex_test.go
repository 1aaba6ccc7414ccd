package drill

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/testutil"
)

// yandexScenarios are the drill's scenarios that run on the Yandex backend:
// create, attach, the offline resize (queued and detached) and delete. The
// snapshot ones need a Snapshotter (Yandex has none in csid yet) and
// device-reuse the local backend.
var yandexScenarios = []string{"create", "publish", "unpublish", "delete", "expand-detached", "grow-at-stage", "expand-attached"}

// yandexPoints are the crash points in csid's generic code (the engine,
// the executors, the mounter): the local backend's own never fire on
// another, nor the snapshot's without snapshots.
func yandexPoints() []string {
	var out []string
	for p := range crash.Points {
		if !strings.HasPrefix(p, "local.") && p != crash.CloudAfterSnapshot {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// yandexBackend runs each cell on a fake of the Yandex API of its own,
// with a loop node standing in for the instance csid runs on (NodeID), in
// the cell's directory: a disk attached to it is a loop device bound to an
// image named after the disk id, linked from the node's by-id directory,
// and csid proves it by that name (--yandex-loop-serial) where a real node
// reads the virtio serial.
func yandexBackend() *Backend {
	return &Backend{Name: "yandex on the fake API", Scale: 16, Open: openYandexCell}
}

func openYandexCell(ctx context.Context, dir string) (_ *CellCloud, err error) {
	f, err := yandexfake.Start(ctx, yandexfake.Options{})
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	zone := f.Zones()[0]
	if err := f.AddInstance(NodeID, zone, yandex.DefaultMaxDisks); err != nil {
		return nil, err
	}
	node, err := yandexfake.NewLoopNode(f, NodeID, filepath.Join(dir, "node"))
	if err != nil {
		return nil, err
	}
	keyFile := filepath.Join(dir, "key.json")
	if _, err := f.WriteServiceAccountKey(keyFile); err != nil {
		return nil, err
	}
	c, err := yandex.New(ctx, yandex.Options{Endpoint: f.Endpoint(), Insecure: true, FolderID: f.FolderID(), KeyFile: keyFile,
		Zones: []string{zone}, Driver: driver.DefaultName})
	if err != nil {
		return nil, err
	}
	args := []string{"--cloud", "yandex", "--yandex-endpoint", f.Endpoint(), "--yandex-insecure",
		"--yandex-folder-id", f.FolderID(), "--yandex-key-file", keyFile, "--yandex-zones", zone,
		"--yandex-by-id-dir", node.ByIDDir(), "--yandex-loop-serial"}
	return &CellCloud{
		Args:      args,
		Inspect:   func(context.Context) (check.Cloud, error) { return yandexInspector{c, node}, nil },
		ImagePath: func(diskID string) (string, error) { return node.ImagePath(diskID), nil },
		Close: func() error {
			err := node.Close()
			c.Close()
			f.Close()
			return err
		},
	}, nil
}

// yandexInspector is what the leak checks read: csid's disks, through the
// backend, and the loop devices of the node standing in for the instance.
type yandexInspector struct {
	c    *yandex.Cloud
	node *yandexfake.LoopNode
}

func (y yandexInspector) Disks(ctx context.Context) ([]cloud.Disk, error) {
	var out []cloud.Disk
	for token := ""; ; {
		page, err := y.c.ListDisks(ctx, cloud.ListOptions{PageToken: token})
		if err != nil {
			return nil, err
		}
		out = append(out, page.Disks...)
		if token = page.NextToken; token == "" {
			return out, nil
		}
	}
}

func (y yandexInspector) LoopDevices(context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	for id, dev := range y.node.Devices() {
		out[id] = []string{dev}
	}
	return out, nil
}

// TestDrillYandex runs the drill's create, attach, resize and delete
// scenarios on the Yandex backend against the fake API, killing csid at
// every hit of every crash point of csid's generic code each reaches: the
// invariants hold as on the local backend, and every point fires.
func TestDrillYandex(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	cfg := Config{Binary: buildCSID(t, dir, nil), Dir: dir, Backend: yandexBackend(),
		Scenarios: yandexScenarios, Points: yandexPoints()}
	rep := runAndReport(t, cfg)
	if len(rep.Unfired) > 0 {
		t.Errorf("crash points that never fired on Yandex: %v", rep.Unfired)
	}
}

// TestDrillYandexCatchesANonIdempotentExecutor: the drill on Yandex sees
// what it sees on the local backend. With the planted create executor
// that makes a disk under a fresh name on every run (plantBug), the crash
// at cloud.after_create leaves a disk in the fake cloud, and the cell
// fails on it.
func TestDrillYandexCatchesANonIdempotentExecutor(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	rep, err := Run(context.Background(), Config{Binary: buildCSID(t, dir, plantBug(t)), Dir: dir, Backend: yandexBackend(),
		Scenarios: []string{"create"}, Points: []string{crash.CloudAfterCreate}})
	caughtLeakedDisk(t, rep, err)
}
