package app

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SocketPath reads a CSI endpoint: "unix:///abs/path" or "/abs/path".
func SocketPath(endpoint string) (string, error) {
	p := strings.TrimPrefix(endpoint, "unix://")
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("endpoint %q: want unix:///absolute/path or /absolute/path", endpoint)
	}
	if len(p) > 107 {
		return "", fmt.Errorf("endpoint %q: a unix socket path holds at most 107 bytes", endpoint)
	}
	return filepath.Clean(p), nil
}

// ErrInUse says a socket is served by a live process.
var ErrInUse = errors.New("socket in use")

// SocketPerm is the mode and owner csid gives a unix socket it creates,
// whatever the umask, and what it gives the directories it creates for it.
type SocketPerm struct {
	Mode os.FileMode
	// UID and GID own the socket and the directories; -1 keeps csid's own.
	UID, GID int
}

// DefaultSocketMode is the CSI socket's mode: its owner and group may
// connect (kubelet and the sidecars run as root, or in csid's group).
const DefaultSocketMode os.FileMode = 0o660

// dirMode is the mode of a directory csid creates for the socket: its
// owner may do anything there, and whoever may use the socket may reach it.
func (p SocketPerm) dirMode() os.FileMode {
	d := os.FileMode(0o700)
	if p.Mode&0o070 != 0 {
		d |= 0o050
	}
	if p.Mode&0o007 != 0 {
		d |= 0o005
	}
	return d
}

// chown gives path the owner p names, if it names one.
func (p SocketPerm) chown(path string) error {
	if p.UID < 0 && p.GID < 0 {
		return nil
	}
	if err := os.Lchown(path, p.UID, p.GID); err != nil {
		return fmt.Errorf("give %s the owner %d:%d: %w", path, p.UID, p.GID, err)
	}
	return nil
}

// ParseOwner reads an owner "user[:group]", by name or number; "" is
// (-1, -1): csid's own.
func ParseOwner(s string) (uid, gid int, err error) {
	if s == "" {
		return -1, -1, nil
	}
	name, group, hasGroup := strings.Cut(s, ":")
	uid, gid = -1, -1
	if name != "" {
		if uid, err = strconv.Atoi(name); err != nil {
			u, lerr := user.Lookup(name)
			if lerr != nil {
				return 0, 0, fmt.Errorf("owner %q: %w", s, lerr)
			}
			uid, _ = strconv.Atoi(u.Uid)
		}
	}
	if hasGroup && group != "" {
		if gid, err = strconv.Atoi(group); err != nil {
			g, lerr := user.LookupGroup(group)
			if lerr != nil {
				return 0, 0, fmt.Errorf("owner %q: %w", s, lerr)
			}
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	if uid < -1 || gid < -1 {
		return 0, 0, fmt.Errorf("owner %q: ids are not negative", s)
	}
	return uid, gid, nil
}

// listenUnix listens on a unix socket with the mode and owner p says. A
// stale socket file (nobody answers) is replaced; a socket a live process
// serves is refused, naming that process, rather than stolen from it.
//
// The socket is never more open than asked, not even for an instant: its
// mode is set on the socket before bind(2) creates the file (which then
// applies the umask, and can only take bits away), and restored exactly
// after it; the owner is changed last. Directories csid creates for it get
// p's owner and a mode that lets the socket's users reach it.
func listenUnix(path string, p SocketPerm) (net.Listener, error) {
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("%s exists and is not a socket; csid will not replace it", path)
		}
		if conn, err := net.DialTimeout("unix", path, 500*time.Millisecond); err == nil {
			who := peer(conn)
			conn.Close()
			return nil, fmt.Errorf("%s is served by %s: %w (stop it, or choose another endpoint)", path, who, ErrInUse)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	if err := mkdirs(filepath.Dir(path), p); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		if cerr := c.Control(func(fd uintptr) { err = unix.Fchmod(int(fd), uint32(p.Mode.Perm())) }); cerr != nil {
			return cerr
		}
		return err
	}}
	l, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, p.Mode.Perm()); err != nil {
		l.Close()
		return nil, err
	}
	if err := p.chown(path); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// mkdirs creates dir and its missing parents with p's directory mode and
// owner, whatever the umask; directories that exist are left as they are.
func mkdirs(dir string, p SocketPerm) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirs(parent, p); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, p.dirMode()); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	} else if err != nil {
		return nil // made meanwhile by someone else: theirs
	}
	if err := os.Chmod(dir, p.dirMode()); err != nil {
		return err
	}
	return p.chown(dir)
}

// PeerPID is the process id of the other end of a unix connection
// (SO_PEERCRED), as seen from this process's pid namespace: 0 for a
// process in a pid namespace this one does not contain.
func PeerPID(conn net.Conn) (int32, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("not a unix connection: %T", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	if cerr := raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); cerr != nil {
		return 0, cerr
	}
	if err != nil {
		return 0, err
	}
	return cred.Pid, nil
}

// peer names the process at the other end of a unix connection.
func peer(conn net.Conn) string {
	pid, err := PeerPID(conn)
	if err != nil {
		return "another process"
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	if len(line) > 120 {
		line = line[:120] + "..."
	}
	if line == "" {
		return fmt.Sprintf("pid %d", pid)
	}
	return fmt.Sprintf("pid %d (%s)", pid, line)
}
