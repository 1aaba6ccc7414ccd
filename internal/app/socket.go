package app

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
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

// listenUnix listens on a unix socket. A stale socket file (nobody
// answers) is replaced; a socket a live process serves is refused, naming
// that process, rather than stolen from it.
func listenUnix(path string, mode os.FileMode) (net.Listener, error) {
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
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if mode == 0 {
		return net.Listen("unix", path)
	}
	// With a mode, the socket gets it before anyone can see it: it is made
	// under a temporary name, given its mode, then renamed into place.
	tmp := filepath.Join(filepath.Dir(path), fmt.Sprintf(".%d.sock", os.Getpid()))
	_ = os.Remove(tmp)
	l, err := net.Listen("unix", tmp)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, mode); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	if err := os.Rename(tmp, path); err != nil {
		l.Close()
		os.Remove(tmp)
		return nil, err
	}
	return &renamedListener{l, path}, nil
}

// renamedListener removes the socket at its final path when closed (the
// listener itself knows only the temporary name it was made under).
type renamedListener struct {
	net.Listener
	path string
}

func (l *renamedListener) Close() error {
	err := l.Listener.Close()
	_ = os.Remove(l.path)
	return err
}

// peer names the process at the other end of a unix connection.
func peer(conn net.Conn) string {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return "another process"
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return "another process"
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, err = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err != nil || cred == nil {
		return "another process"
	}
	cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", cred.Pid))
	line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
	if len(line) > 120 {
		line = line[:120] + "..."
	}
	if line == "" {
		return fmt.Sprintf("pid %d", cred.Pid)
	}
	return fmt.Sprintf("pid %d (%s)", cred.Pid, line)
}
