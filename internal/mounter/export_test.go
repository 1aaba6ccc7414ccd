package mounter

import (
	"testing"

	"golang.org/x/sys/unix"
)

// SuiteEnv gives the external contract test (mounter_test) a sandbox: a
// directory, blank loop devices, a device that cannot be read, and the
// regrowth of a device as a detach, resize and attach.
func SuiteEnv(t *testing.T) (dir string, device func(int64) string, unreadable func() string, regrow func(string, int64) string) {
	sb := newSandbox(t)
	unreadable = func() string {
		t.Helper()
		p := sb.path("no-driver")
		if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(unusedBlockMajor(t), 0))); err != nil {
			t.Fatal(err)
		}
		return p
	}
	return sb.dir, sb.device, unreadable, sb.regrow
}
