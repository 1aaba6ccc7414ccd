package app_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/yandex"
	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
)

// The Yandex stories run csid in-process (app.Run, the real wiring of
// --cloud yandex) against a fake of the Yandex API (yandexfake: the
// vendor's generated gRPC services, reached through the backend's
// generated clients over a real connection). Each instance csid runs on is simulated by a loop
// node: a disk attached to it becomes a loop device bound to an image
// named after the disk id, linked from a by-id directory the test owns, as
// virtio-<disk id>; csid proves a device by its loop backing file's name
// (YandexOptions.LoopSerial) where a real node reads its virtio serial.

const yandexZone = "ru-central1-a"

// yandexCloud is a fake Yandex API for a test, with a service-account key
// of it on disk.
type yandexCloud struct {
	fake    *yandexfake.Fake
	keyFile string
	dir     string
}

// newYandexCloud starts a fake Yandex API with one zone; it stops at the
// end of the test. Its files go under dir.
func newYandexCloud(t *testing.T, dir string) *yandexCloud {
	t.Helper()
	f, err := yandexfake.Start(context.Background(), yandexfake.Options{Zones: []string{yandexZone}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	y := &yandexCloud{fake: f, keyFile: filepath.Join(dir, "key.json"), dir: dir}
	if _, err := f.WriteServiceAccountKey(y.keyFile); err != nil {
		t.Fatal(err)
	}
	return y
}

// instance adds an instance that holds maxDisks disks and simulates it with
// a loop node under the cloud's dir.
func (y *yandexCloud) instance(t *testing.T, id string, maxDisks int) *yandexfake.LoopNode {
	t.Helper()
	if err := y.fake.AddInstance(id, yandexZone, maxDisks); err != nil {
		t.Fatal(err)
	}
	n, err := yandexfake.NewLoopNode(y.fake, id, filepath.Join(y.dir, "instance-"+id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// options are the app.Options of csid on instance node of this cloud.
func (y *yandexCloud) options(node *yandexfake.LoopNode, id string, maxDisks int) app.Options {
	return app.Options{Cloud: "yandex", NodeID: id, Zone: yandexZone, Log: zerolog.Nop(),
		Yandex: app.YandexOptions{Endpoint: y.fake.Endpoint(), Insecure: true, FolderID: y.fake.FolderID(), KeyFile: y.keyFile,
			Zones: []string{yandexZone}, ByIDDir: node.ByIDDir(), MaxDisks: maxDisks, LoopSerial: true}}
}

// client is the backend's own client of the fake, for the checks.
func (y *yandexCloud) client(t *testing.T) *yandex.Cloud {
	t.Helper()
	c, err := yandex.New(context.Background(), yandex.Options{Endpoint: y.fake.Endpoint(), Insecure: true,
		FolderID: y.fake.FolderID(), KeyFile: y.keyFile, Zones: []string{yandexZone}, Driver: driver.DefaultName})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startYandex runs csid on a new fake Yandex API, on instance "node-1"
// simulated by a loop node in the state dir (all-in-one: controller and
// node), which holds maxDisks disks (its max volumes: on Yandex,
// MaxVolumesPerNode is not read).
func startYandex(t *testing.T, maxDisks int) (*apptest.Instance, *yandexCloud) {
	t.Helper()
	dir := apptest.ShortTempDir(t)
	y := newYandexCloud(t, dir)
	node := y.instance(t, "node-1", maxDisks)
	yo := y.options(node, "node-1", maxDisks)
	yo.StateDir = dir
	return apptest.Start(t, yo), y
}

// checkNothingLeftOnYandex fails the test if a disk made by csid is left in
// the fake cloud, or a loop device or mount under dir (the instances'
// images, the staging and target paths) is left on the host.
func checkNothingLeftOnYandex(t *testing.T, what string, y *yandexCloud) {
	t.Helper()
	c := y.client(t)
	for token := ""; ; {
		page, err := c.ListDisks(context.Background(), cloud.ListOptions{PageToken: token})
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Disks {
			t.Errorf("%s: disk %s (%s) left in the cloud, attached to %q", what, d.ID, d.Name, d.AttachedTo)
		}
		if token = page.NextToken; token == "" {
			break
		}
	}
	loops, err := loopdev.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range loops {
		if strings.HasPrefix(l.BackingFile, y.dir+"/") {
			t.Errorf("%s: loop device %s of %s left", what, l.Path, l.BackingFile)
		}
	}
	for _, m := range mountsUnder(t, y.dir) {
		t.Errorf("%s: mount left at %s", what, m)
	}
}

// TestOfflineResizeStoryOnYandex is issue 5's whole story on the Yandex
// backend against the fake API, with loop devices standing in for the
// attached disks of two instances: a pod on node-1 writes a file into its
// volume; the volume is expanded while attached (queued,
// FailedPrecondition: Yandex disks grow detached); the pod's replacement on
// node-2 cannot have the volume while node-1 holds it; the pod on node-1
// goes away and the volume is unpublished, which grows the disk through
// the API; the publish to node-2 attaches after the grow, node-2's csid
// finds the disk by its by-id link and proves it, the stage shows the
// larger filesystem, and the file is intact.
func TestOfflineResizeStoryOnYandex(t *testing.T) {
	testutil.RequireRoot(t)
	dir := apptest.ShortTempDir(t)
	y := newYandexCloud(t, dir)
	n1, n2 := y.instance(t, "node-1", 4), y.instance(t, "node-2", 4)
	o1 := y.options(n1, "node-1", 4)
	o1.StateDir, o1.Endpoint = filepath.Join(dir, "n1"), "unix://"+dir+"/all.sock"
	o2 := y.options(n2, "node-2", 4)
	o2.StateDir, o2.Endpoint, o2.Mode = filepath.Join(dir, "n2"), "unix://"+dir+"/node2.sock", driver.ModeNode
	for _, d := range []string{o1.StateDir, o2.StateDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	all, node2 := apptest.Start(t, o1), apptest.Start(t, o2)
	const size, grown = 1 << 30, 2 << 30 // Yandex sizes disks in whole GiB
	id := offlineResizeStory(t, story{dir: dir, all: apptest.Dial(t, all.Socket), node2: apptest.Dial(t, node2.Socket),
		size: size, grown: grown,
		published2: func(t *testing.T, publishContext map[string]string) {
			d, err := y.client(t).GetDisk(context.Background(), publishContext[effects.PublishContextDiskID])
			if err != nil || d.SizeBytes != grown || d.AttachedTo != "node-2" {
				t.Fatalf("after the publish to node-2 the disk is %+v, %v; want %d bytes, attached to node-2", d, err, int64(grown))
			}
			if devs := n2.Devices(); len(devs) != 1 || devs[d.ID] == "" {
				t.Fatalf("node-2's loop node has %v, want disk %s", devs, d.ID)
			}
		}})
	all.Stop(t)
	node2.Stop(t)
	checkResizeBeforeAttach(t, app.StateFile(o1.StateDir, driver.ModeAll), id, "node-2")
	checkNothingLeftOnYandex(t, "story", y)
}

// TestNodeIDFromTheMetadataService: a node csid on Yandex given no node id
// takes the instance id from the instance's metadata service (the fake's,
// which answers as Yandex's does): NodeGetInfo names the instance and the
// zone the Compute API has it in, under topology.kubernetes.io/zone (not
// the metadata's zone, which this test makes another, nor --zone, which is
// not read on Yandex), and the node's limit is --yandex-max-disks (the API
// does not say how many disks an instance holds: the fake's instance here
// holds more).
func TestNodeIDFromTheMetadataService(t *testing.T) {
	dir := apptest.ShortTempDir(t)
	y := newYandexCloud(t, dir)
	const instance, zone = "fhm0metadata00000001", yandexZone
	node := y.instance(t, instance, 8)
	srv := y.fake.MetadataServer(instance, "ru-central1-x", y.fake.FolderID())
	o := y.options(node, "", 6)
	o.Zone, o.Mode, o.StateDir, o.Endpoint = "zone-ignored", driver.ModeNode, dir, "unix://"+dir+"/csi.sock"
	o.Yandex.MetadataURL = srv.URL
	ready := make(chan struct{})
	o.Ready = ready
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("csid stopped with: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		done <- err
		t.Fatalf("csid did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("csid did not become ready within 30s")
	}
	info := apptest.R(apptest.Dial(t, dir+"/csi.sock").NodeGetInfo(ctx, &csi.NodeGetInfoRequest{})).Must(t)
	if info.NodeId != instance || info.AccessibleTopology.GetSegments()[driver.ZoneTopologyKey] != zone || info.MaxVolumesPerNode != 6 {
		t.Fatalf("NodeGetInfo %+v, want node %s in zone %s with 6 volumes", info, instance, zone)
	}
}
