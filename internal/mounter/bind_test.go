package mounter

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/csid-dev/csid/internal/testutil"
)

// staged formats and mounts a small ext4 with the flags kubelet-style
// staging may carry, to publish from.
func staged(tb testing.TB, sb *sandbox) string {
	tb.Helper()
	staging := sb.path("staging")
	if _, err := New().FormatAndMount(context.Background(), sb.device(32*mib), staging, "ext4", []string{"nosuid", "nodev", "noexec", "noatime"}, nil); err != nil {
		tb.Fatal(err)
	}
	return staging
}

// Bind mounts are made with mount(2) instead of mount(8) because they are
// faster (BenchmarkBindPublish); this is the proof that they are also the
// same: the mount table cannot tell the two apart.
func TestBindMountMatchesMountUtils(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	staging := staged(t, sb)
	viaExec := mountutils.NewWithoutSystemd("")
	m := New()
	ctx := context.Background()
	for _, ro := range []bool{false, true} {
		name := map[bool]string{false: "rw", true: "ro"}[ro]
		a, b := sb.path("exec-"+name), sb.path("syscall-"+name)
		if err := os.MkdirAll(a, 0o750); err != nil {
			t.Fatal(err)
		}
		opts := []string{"bind"}
		if ro {
			opts = append(opts, "ro")
		}
		if err := viaExec.Mount(staging, a, "", opts); err != nil {
			t.Fatal(err)
		}
		if err := m.BindMount(ctx, staging, b, ro); err != nil {
			t.Fatal(err)
		}
		ea, eb := mountEntry(t, a), mountEntry(t, b)
		if !sameMount(ea, eb) {
			t.Errorf("%s: mount(8) made\n\t%+v\nmount(2) made\n\t%+v", name, *ea, *eb)
		}
		if hasOption(eb.Options, "ro") != ro || !hasOption(eb.Options, "nosuid") || !hasOption(eb.Options, "noexec") {
			t.Errorf("%s: the bind mount lost flags of its source: %s", name, eb.Options)
		}
		// Unmounting: umount(8) and umount(2) leave the same nothing.
		if err := viaExec.Unmount(a); err != nil {
			t.Fatal(err)
		}
		if err := m.Unmount(ctx, b); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{a, b} {
			if mounted, _ := mountinfo.Mounted(p); mounted {
				t.Errorf("%s is still mounted", p)
			}
		}
	}
}

// Kernels before 5.12 have no mount_setattr; the remount that replaces it
// must make the same mount too.
func TestReadOnlyRemountFallbackMatchesMountUtils(t *testing.T) {
	testutil.RequireRoot(t)
	sb := newSandbox(t)
	staging := staged(t, sb)
	a, b := sb.path("exec"), sb.path("fallback")
	for _, p := range []string{a, b} {
		if err := os.MkdirAll(p, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	if err := mountutils.NewWithoutSystemd("").Mount(staging, a, "", []string{"bind", "ro"}); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(staging, b, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(b, &st); err != nil {
		t.Fatal(err)
	}
	if err := remountReadOnly(b, &st, true); err != nil {
		t.Fatal(err)
	}
	if ea, eb := mountEntry(t, a), mountEntry(t, b); !sameMount(ea, eb) {
		t.Errorf("mount(8) made\n\t%+v\nthe fallback made\n\t%+v", *ea, *eb)
	}
}

// sameMount compares two mount table entries but for what must differ
// between two mounts (the ids and the mount point).
func sameMount(a, b *mountinfo.Info) bool {
	set := func(s string) []string {
		f := strings.Split(s, ",")
		slices.Sort(f)
		return f
	}
	// Peer group ids (shared:N) differ between two mounts; the kind of
	// propagation must not.
	kind := func(s string) []string {
		var out []string
		for _, f := range strings.Fields(s) {
			k, _, _ := strings.Cut(f, ":")
			out = append(out, k)
		}
		return out
	}
	return a.Major == b.Major && a.Minor == b.Minor && a.Root == b.Root && a.FSType == b.FSType &&
		a.Source == b.Source && slices.Equal(set(a.Options), set(b.Options)) &&
		slices.Equal(set(a.VFSOptions), set(b.VFSOptions)) && slices.Equal(kind(a.Optional), kind(b.Optional))
}

// BenchmarkBindPublish measures a publish and an unpublish (create the
// target, bind-mount, unmount, remove the target) through mount-utils,
// which execs mount(8) (twice: bind, then remount with the flags) and
// umount(8), and through Linux, which calls mount(2), mount_setattr(2) and
// umount(2).
func BenchmarkBindPublish(b *testing.B) {
	testutil.RequireRoot(b)
	sb := newSandbox(b)
	staging := staged(b, sb)
	viaExec := mountutils.NewWithoutSystemd("")
	m := New()
	ctx := context.Background()
	for _, ro := range []bool{false, true} {
		name := map[bool]string{false: "rw", true: "ro"}[ro]
		target := sb.path("bench-" + name)
		b.Run("mount-utils/"+name, func(b *testing.B) {
			opts := []string{"bind"}
			if ro {
				opts = append(opts, "ro")
			}
			for b.Loop() {
				if err := os.Mkdir(target, 0o750); err != nil {
					b.Fatal(err)
				}
				if err := viaExec.Mount(staging, target, "", opts); err != nil {
					b.Fatal(err)
				}
				if err := viaExec.Unmount(target); err != nil {
					b.Fatal(err)
				}
				if err := os.Remove(target); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("syscall/"+name, func(b *testing.B) {
			for b.Loop() {
				if err := m.BindMount(ctx, staging, target, ro); err != nil {
					b.Fatal(err)
				}
				if err := m.Unmount(ctx, target); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDeviceUses is what looking a device up in the mount table
// costs a node op (a raw block publish that is refused, a filesystem
// publish, a repeated stage or publish): one read of the mount table, and
// a statx of each bind mount on a devtmpfs or tmpfs. The device here is
// mounted at a staging path and bound at a target.
func BenchmarkDeviceUses(b *testing.B) {
	testutil.RequireRoot(b)
	sb := newSandbox(b)
	staging := staged(b, sb)
	dev, err := New().DeviceOf(context.Background(), staging)
	if err != nil {
		b.Fatal(err)
	}
	m := New()
	if err := m.BindMount(context.Background(), staging, sb.path("target"), false); err != nil {
		b.Fatal(err)
	}
	defer m.Unmount(context.Background(), sb.path("target"))
	table, err := mountinfo.GetMounts(nil)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if uses, err := m.DeviceUses(context.Background(), dev); err != nil || len(uses) != 2 {
			b.Fatalf("DeviceUses = %v, %v", uses, err)
		}
	}
	b.ReportMetric(float64(len(table)), "mounts")
}
