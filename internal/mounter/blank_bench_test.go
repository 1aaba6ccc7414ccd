package mounter

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/loopdev"
	"github.com/csid-dev/csid/internal/testutil"
)

// BenchmarkBlankProbe measures the probe of a blank 64 MiB device, fresh
// each time (a new sparse image on a new loop device, as a stage sees it):
// the blank check, and the probe before it (a read of the first MiB, then
// blkid -p), on buffered loop devices; and the blank check on loop devices
// bound with direct I/O, as the local backend binds them (check-directio),
// and the check by the backing file's map there (map-directio), which
// reads nothing.
func BenchmarkBlankProbe(b *testing.B) {
	testutil.RequireRoot(b)
	probes := map[string]func(dev string) error{
		"check": func(dev string) error {
			_, err := zeroWhereBlkidLooks(dev)
			return err
		},
		"before": func(dev string) error {
			if err := readFirstMiB(dev); err != nil {
				return err
			}
			_, err := execRun(context.Background(), "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev)
			if exitCode(err) == 2 {
				err = nil
			}
			return err
		},
	}
	probes["check-directio"] = probes["check"]
	probes["map-directio"] = func(dev string) error {
		f, size, err := openProbed(dev)
		if err != nil {
			return err
		}
		defer f.Close()
		zero, err := loopdev.Zeroed(f, size)
		if err == nil && !zero {
			err = fmt.Errorf("%s: a fresh sparse image, not zero by its map", dev)
		}
		return err
	}
	for _, name := range []string{"check", "check-directio", "map-directio", "before"} {
		b.Run(name, func(b *testing.B) {
			sb := newSandbox(b)
			sb.bind.DirectIO = strings.HasSuffix(name, "-directio")
			for b.Loop() {
				b.StopTimer()
				dev := sb.device(64 * mib)
				b.StartTimer()
				if err := probes[name](dev); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sb.detach(dev)
				b.StartTimer()
			}
		})
	}
}

// readFirstMiB reads the first MiB of dev bypassing the page cache, as the
// probe proved a device readable before the blank check.
func readFirstMiB(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_CLOEXEC|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	buf, err := unix.Mmap(-1, 0, int(mib), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	_, err = f.ReadAt(buf, 0)
	return err
}
