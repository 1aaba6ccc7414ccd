package app_test

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/app"
	"github.com/csid-dev/csid/internal/app/apptest"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/testutil"
	"github.com/rs/zerolog"
)

// TestCSISocketModeAndOwner: at umask 000, the CSI socket gets exactly the
// mode asked (0660 by default) and the owner asked; the directories csid
// creates for it get that owner and a mode that lets the socket's users
// reach it, and nothing more; a directory that existed is left as it was.
// The admin socket stays 0600. (The test is not parallel: the umask is the
// process's.)
func TestCSISocketModeAndOwner(t *testing.T) {
	testutil.RequireRoot(t) // chown
	defer syscall.Umask(syscall.Umask(0))
	cases := []struct {
		name              string
		mode              os.FileMode
		owner             string
		wantMode, wantDir os.FileMode
		uid, gid          uint32
	}{
		{"default", 0, "", 0o660, 0o750, 0, 0},
		{"owner only, another user", 0o600, "1234:5678", 0o600, 0o700, 1234, 5678},
		{"everyone, a group", 0o666, ":5678", 0o666, 0o755, 0, 5678},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := apptest.ShortTempDir(t)
			existing := filepath.Join(dir, "existing")
			if err := os.Mkdir(existing, 0o777); err != nil {
				t.Fatal(err)
			}
			sock := filepath.Join(existing, "new", "sub", "csi.sock")
			in := apptest.Start(t, app.Options{Cloud: "fake", StateDir: dir, Endpoint: "unix://" + sock,
				SocketMode: c.mode, SocketOwner: c.owner, Log: zerolog.Nop()})
			apptest.R(apptest.Dial(t, in.Socket).GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{})).Must(t)
			expect := func(path string, typ, mode os.FileMode, uid, gid uint32) {
				t.Helper()
				fi, err := os.Lstat(path)
				if err != nil {
					t.Fatal(err)
				}
				st := fi.Sys().(*syscall.Stat_t)
				if fi.Mode().Type() != typ || fi.Mode().Perm() != mode || st.Uid != uid || st.Gid != gid {
					t.Errorf("%s: %v owned by %d:%d; want %v owned by %d:%d", path, fi.Mode(), st.Uid, st.Gid, typ|mode, uid, gid)
				}
			}
			expect(sock, os.ModeSocket, c.wantMode, c.uid, c.gid)
			expect(filepath.Join(existing, "new"), os.ModeDir, c.wantDir, c.uid, c.gid)
			expect(filepath.Join(existing, "new", "sub"), os.ModeDir, c.wantDir, c.uid, c.gid)
			expect(existing, os.ModeDir, 0o777, 0, 0)
			expect(app.AdminSocketPath(dir, driver.ModeAll), os.ModeSocket, 0o600, 0, 0)
		})
	}
}
