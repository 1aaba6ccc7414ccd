package mounter

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/csid-dev/csid/internal/testutil"
)

// growSetup makes an ext4 of 64 MiB holding a file, unmounted, on a device
// that has then grown to size: the next FormatAndMount grows it, offline
// (the mounter m may not grow ext4 online).
func growSetup(t *testing.T, size int64) (sb *sandbox, m *Linux, rec *recorder, dev string) {
	t.Helper()
	testutil.RequireRoot(t)
	sb = newSandbox(t)
	rec = &recorder{}
	m = newLinux(rec.run)
	m.grow, m.onlineExt = growRecords{dir: sb.path("grow")}, false
	dev = sb.device(64 * mib)
	target := sb.path("staging")
	ctx := context.Background()
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("before the growth\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(ctx, target); err != nil {
		t.Fatal(err)
	}
	dev = sb.regrow(dev, size)
	rec.reset()
	return sb, m, rec, dev
}

func growRecordsLeft(t *testing.T, sb *sandbox) []string {
	t.Helper()
	left, _ := filepath.Glob(sb.path("grow", "*"))
	return left
}

// A context that ends between the steps of an offline growth stops it
// before its next step, and a later FormatAndMount finishes the growth.
func TestGrowthStopsBeforeItsNextStepOnceCancelled(t *testing.T) {
	t.Parallel()
	sb, m, rec, dev := growSetup(t, 128*mib)
	ctx, cancel := context.WithCancel(context.Background())
	rec.after = func(name string) {
		if name == "e2fsck" {
			cancel()
		}
	}
	target := sb.path("staging")
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("FormatAndMount cancelled after e2fsck: %v, want context.Canceled", err)
	}
	if size, err := extSize(dev); err != nil || size != 64*mib {
		t.Fatalf("the filesystem is %d bytes (%v): resize2fs ran after the context ended", size, err)
	}
	if ok, _ := m.IsMounted(context.Background(), target); ok {
		t.Fatal("mounted after the context ended")
	}
	if len(growRecordsLeft(t, sb)) != 1 {
		t.Fatal("the growth that did not finish left no record")
	}

	rec.reset()
	rec.after = nil
	if _, err := m.FormatAndMount(context.Background(), dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if !rec.ranProgram("resize2fs") || rec.ranCommand("e2fsck -f -y") {
		t.Fatalf("the second FormatAndMount ran %v; want resize2fs, and no e2fsck -y on a clean filesystem", rec.cmds)
	}
	if got, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(got) != "before the growth\n" {
		t.Fatalf("data after the growth: %q, %v", got, err)
	}
	if left := growRecordsLeft(t, sb); len(left) > 0 {
		t.Fatalf("growth records left: %v", left)
	}
}

// Damage the growth did not cause is not csid's to repair: e2fsck -p
// refuses it, FormatAndMount says to run e2fsck by hand, never answers
// e2fsck's questions itself, and keeps no record.
func TestGrowthDoesNotRepairWhatItDidNotBreak(t *testing.T) {
	t.Parallel()
	sb, m, rec, dev := growSetup(t, 128*mib)
	// The root directory made a regular file: e2fsck -p stops at it.
	if out, err := exec.Command("debugfs", "-w", "-R", "set_inode_field <2> mode 0100644", dev).CombinedOutput(); err != nil {
		t.Fatalf("debugfs: %v: %s", err, out)
	}
	_, err := m.FormatAndMount(context.Background(), dev, sb.path("staging"), "ext4", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "run e2fsck by hand") {
		t.Fatalf("FormatAndMount of a damaged filesystem: %v, want an error saying to run e2fsck by hand", err)
	}
	if rec.ranCommand("e2fsck -f -y") || rec.ranProgram("resize2fs") {
		t.Fatalf("ran %v on a filesystem damaged before the growth", rec.cmds)
	}
	if left := growRecordsLeft(t, sb); len(left) > 0 {
		t.Fatalf("growth records left: %v", left)
	}
	if out, err := exec.Command("e2fsck", "-fn", dev).CombinedOutput(); err == nil || !strings.Contains(string(out), "Root inode is not a directory") {
		t.Fatalf("the damage was repaired without asking: %v: %s", err, out)
	}
}

// Growing beyond the descriptor blocks the filesystem reserved would make
// resize2fs move inode tables, where a kill can leave nothing to repair:
// refused offline, with a message that says what to do, and nothing run.
func TestGrowthBeyondReservedDescriptorsIsRefusedOffline(t *testing.T) {
	t.Parallel()
	// 64 MiB of 1 KiB blocks reserve 256 descriptor blocks: enough for
	// about 32 GiB.
	sb, m, rec, dev := growSetup(t, 40<<30)
	_, err := m.FormatAndMount(context.Background(), dev, sb.path("staging"), "ext4", nil, nil)
	if err == nil || !strings.Contains(err.Error(), "reserved") || !strings.Contains(err.Error(), "CAP_SYS_RESOURCE") {
		t.Fatalf("FormatAndMount growing 64 MiB to 40 GiB offline: %v, want a refusal that says why and what to do", err)
	}
	if rec.ranProgram("e2fsck") || rec.ranProgram("resize2fs") {
		t.Fatalf("ran %v", rec.cmds)
	}
	if left := growRecordsLeft(t, sb); len(left) > 0 {
		t.Fatalf("growth records left: %v", left)
	}
}

// Where this process may grow ext4 online, FormatAndMount mounts a grown
// device's filesystem as it is and GrowFilesystem grows it, mounted.
func TestGrowthIsOnlineWhereAllowed(t *testing.T) {
	t.Parallel()
	sb, m, rec, dev := growSetup(t, 128*mib)
	if m.onlineExt = New().onlineExt; !m.onlineExt {
		t.Skip("this process lacks CAP_SYS_RESOURCE, which online ext4 growth needs (as in containers that drop it): " +
			"only the offline growth can be tested here")
	}
	target := sb.path("staging")
	ctx := context.Background()
	if _, err := m.FormatAndMount(ctx, dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if rec.ranProgram("resize2fs") || rec.ranProgram("e2fsck") {
		t.Fatalf("grown offline: %v", rec.cmds)
	}
	if grew, err := m.GrowFilesystem(ctx, dev, target); err != nil || !grew {
		t.Fatalf("GrowFilesystem = %v, %v; want grown online", grew, err)
	}
}

// A growth that cannot be recorded (the state directory's file system is
// full, or the directory is immutable) does not start: nothing runs, the
// filesystem keeps its size, and once the fault is gone the growth goes
// ahead.
func TestGrowthDoesNotStartUnrecorded(t *testing.T) {
	t.Parallel()
	for _, fault := range []string{"full", "immutable"} {
		t.Run(fault, func(t *testing.T) {
			sb, m, rec, dev := growSetup(t, 128*mib)
			state := testutil.SmallFS(t, 8*mib)
			m.grow = growRecords{dir: filepath.Join(state, "grow")}
			if err := os.Mkdir(m.grow.dir, 0o700); err != nil {
				t.Fatal(err)
			}
			clear := func() {}
			switch fault {
			case "full":
				clear = testutil.Fill(t, state, "filler")
			case "immutable":
				testutil.SetImmutable(t, m.grow.dir, true)
				clear = func() { testutil.SetImmutable(t, m.grow.dir, false) }
			}
			target := sb.path("staging")
			_, err := m.FormatAndMount(context.Background(), dev, target, "ext4", nil, nil)
			if err == nil || !strings.Contains(err.Error(), "record the growth") {
				t.Fatalf("FormatAndMount with the growth record unwritable: %v, want an error saying so", err)
			}
			if rec.ranProgram("e2fsck") || rec.ranProgram("resize2fs") {
				t.Fatalf("ran %v without a record of the growth", rec.cmds)
			}
			if size, err := extSize(dev); err != nil || size != 64*mib {
				t.Fatalf("the filesystem is %d bytes (%v), want it untouched", size, err)
			}
			clear()
			if _, err := m.FormatAndMount(context.Background(), dev, target, "ext4", nil, nil); err != nil {
				t.Fatalf("FormatAndMount once the fault is gone: %v", err)
			}
			if size, err := extSize(dev); err != nil || size < 120*mib {
				t.Fatalf("the filesystem is %d bytes (%v) once the fault is gone: not grown", size, err)
			}
			if left, _ := filepath.Glob(filepath.Join(m.grow.dir, "*")); len(left) > 0 {
				t.Fatalf("growth records left: %v", left)
			}
		})
	}
}
