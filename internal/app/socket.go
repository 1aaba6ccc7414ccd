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
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if mode != 0 {
		if err := os.Chmod(path, mode); err != nil {
			l.Close()
			return nil, err
		}
	}
	return l, nil
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
