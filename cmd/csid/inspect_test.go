package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/admin"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/cloud/fake"
	"github.com/csid-dev/csid/internal/driver"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// volumes of a lifecycle story, by what they show.
type story struct {
	created, published, failed string
	staging, target            string
}

// tell drives csid through CSI into volumes in several states: one created,
// one published with an expansion queued behind its attachment, one whose
// attach failed for good.
func tell(t *testing.T, c apptest.Client, dir string, f *fake.Cloud) story {
	t.Helper()
	ctx := context.Background()
	vc := apptest.MountCap("ext4")
	create := func(name string) string {
		return apptest.R(c.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
			VolumeCapabilities: []*csi.VolumeCapability{vc}, Parameters: map[string]string{"csi.storage.k8s.io/pvc/name": name}})).Must(t).Volume.VolumeId
	}
	s := story{created: create("pvc-created"), published: create("pvc-published"), failed: create("pvc-failed"),
		staging: filepath.Join(dir, "staging"), target: filepath.Join(dir, "target")}

	pub := apptest.R(c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: s.published, NodeId: "node-1", VolumeCapability: vc})).Must(t)
	apptest.R(c.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: s.published, StagingTargetPath: s.staging, VolumeCapability: vc, PublishContext: pub.PublishContext})).Must(t)
	apptest.R(c.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: s.published, TargetPath: s.target, StagingTargetPath: s.staging, VolumeCapability: vc})).Must(t)
	_, err := c.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: s.published, CapacityRange: &csi.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: vc})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("expand of a published volume: %v, want FailedPrecondition (queued)", err)
	}

	f.FailCalls(cloud.OpAttach, 1, errors.New("instance node-1 is being replaced"))
	if _, err := c.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: s.failed, NodeId: "node-1", VolumeCapability: vc}); err == nil {
		t.Fatal("publish with a failing attach succeeded")
	}
	return s
}

// questions are the inspect commands asked of both a live csid and a copy
// of its state file, in every output format.
func questions(s story) [][]string {
	var out [][]string
	for _, o := range []string{"table", "json", "yaml"} {
		out = append(out,
			[]string{"volumes", "-o", o},
			[]string{"volumes", "--state", "CREATED", "-o", o},
			[]string{"volumes", "--node", "node-1", "-o", o},
			[]string{"volume", s.created, "-o", o},
			[]string{"volume", s.published, "-o", o},
			[]string{"volume", s.failed, "-o", o},
			[]string{"ops", "-o", o},
			[]string{"ops", "--pending", "-o", o},
			[]string{"ops", "--failed", "-o", o},
			[]string{"resizes", "-o", o},
		)
	}
	return out
}

// TestInspectLiveAndStateFileAgree is acceptance 1: csid inspect gives the
// same answers, byte for byte, from a live csid (its admin socket, found
// through --state-dir) and from a copy of its state file (--db), for
// volumes created, published with a queued resize, and with a failed op.
func TestInspectLiveAndStateFileAgree(t *testing.T) {
	f := fake.New(fake.Options{Zones: []string{"fake"}})
	l := apptest.Start(t, app.Options{Cloud: "fake", Fake: f})
	s := tell(t, apptest.Dial(t, l.Socket), l.Dir, f)
	now := time.Now()

	qs := questions(s)
	answers := make([]string, len(qs))
	for i, q := range qs {
		answers[i] = inspectAt(t, now, append(q, "--state-dir", l.Dir)...)
	}

	t.Logf("csid inspect volumes:\n%s\ncsid inspect volume %s:\n%s\ncsid inspect volume %s:\n%s", answers[0], s.published, answers[4], s.failed, answers[5])
	// What the answers say, in a few words.
	vols := answers[0]
	for _, want := range []string{s.created + "  pvc-created    CREATED", "PUBLISHED", "queued to 128 MiB", "controller_publish failed: Internal"} {
		if !strings.Contains(vols, want) {
			t.Errorf("csid inspect volumes does not say %q:\n%s", want, vols)
		}
	}
	failed := answers[5]
	if !strings.Contains(failed, "instance node-1 is being replaced") {
		t.Errorf("csid inspect volume %s does not say why its publish failed:\n%s", s.failed, failed)
	}
	if !strings.Contains(answers[4], "waits for the detach from node-1") || !strings.Contains(answers[4], s.target) {
		t.Errorf("csid inspect volume %s:\n%s", s.published, answers[4])
	}

	l.Stop(t)
	cp := filepath.Join(t.TempDir(), "copy.db")
	copyFile(t, app.StateFile(l.Dir, driver.ModeAll), cp)
	for i, q := range qs {
		got := inspectAt(t, now, append(q, "--db", cp)...)
		if got != answers[i] {
			t.Errorf("csid inspect %s: the state file and the live csid differ:\n--- --db\n%s\n--- socket\n%s", strings.Join(q, " "), got, answers[i])
		}
	}
}

func copyFile(t testing.TB, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestInspectLockedStateFile is acceptance 2: --db on the state file of a
// running csid (another process: a real `csid serve`) answers within 2s
// with an error that names the holder and says to use the admin socket.
func TestInspectLockedStateFile(t *testing.T) {
	dir := apptest.ShortTempDir(t)
	child := startServe(t, dir, "--cloud", "fake", "--node-id", "node-1", "--log-level", "error")
	db := app.StateFile(dir, driver.ModeAll)
	if st, err := os.Stat(app.AdminSocketPath(dir, driver.ModeAll)); err != nil || st.Mode().Perm() != 0o600 || st.Mode().Type() != os.ModeSocket {
		t.Errorf("the admin socket: %v, %v; want a socket of mode 0600", st.Mode(), err)
	}

	start := time.Now()
	code, stdout, stderr := cli(t, "inspect", "volumes", "--db", db)
	took := time.Since(start)
	t.Logf("csid inspect --db on a file held by pid %d answered in %v: %s", child.pid(), took.Round(time.Millisecond), stderr)
	if took >= 2*time.Second {
		t.Errorf("answered after %v, want < 2s", took)
	}
	if code != 1 || stdout != "" {
		t.Errorf("exit %d, stdout %q; want 1 and nothing", code, stdout)
	}
	for _, want := range []string{fmt.Sprintf("in use by pid %d", child.pid()), "--socket " + app.AdminSocketPath(dir, driver.ModeAll), "csid inspect volumes"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the error does not say %q:\n%s", want, stderr)
		}
	}

	// The socket it names answers, and so does discovery in --state-dir.
	for _, args := range [][]string{{"--socket", app.AdminSocketPath(dir, driver.ModeAll)}, {"--state-dir", dir}} {
		code, stdout, stderr = cli(t, append([]string{"inspect", "volumes"}, args...)...)
		if code != 0 || !strings.Contains(stdout, "No volumes.") {
			t.Errorf("csid inspect volumes %s: exit %d\n%s%s", args, code, stdout, stderr)
		}
	}
	terminate(t, child, 30*time.Second)

	// Stopped: the file is free, and csid inspect says how to read it.
	code, _, stderr = cli(t, "inspect", "volumes", "--state-dir", dir)
	if code != 1 || !strings.Contains(stderr, "--db "+db) {
		t.Errorf("nothing running: exit %d, want 1 and a hint naming --db %s:\n%s", code, db, stderr)
	}
	if code, stdout, stderr = cli(t, "inspect", "volumes", "--db", db); code != 0 || !strings.Contains(stdout, "No volumes.") {
		t.Errorf("--db of a stopped csid: exit %d\n%s%s", code, stdout, stderr)
	}
}

// startServe runs this test binary as `csid serve --state-dir dir args...`
// (main_test.go's startCSIDProcess) and waits until its admin socket
// answers.
func startServe(t *testing.T, dir string, args ...string) *process {
	t.Helper()
	p := startCSIDProcess(t, "", append([]string{"serve", "--state-dir", dir}, args...)...)
	cl := admin.NewClient(app.AdminSocketPath(dir, driver.ModeAll), time.Second)
	defer cl.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := cl.Info(context.Background()); err == nil {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("csid exited before its admin socket answered (%v):\n%s", p.err, p.stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("csid's admin socket did not answer within 30s:\n%s", p.stderr)
		}
		time.Sleep(20 * time.Millisecond) // polling another process's socket
	}
}
