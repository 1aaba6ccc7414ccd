package fakemount_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/csid-dev/csid/internal/mounter"
	"github.com/csid-dev/csid/internal/mounter/fakemount"
	"github.com/csid-dev/csid/internal/mounter/mountertest"
)

func TestContract(t *testing.T) {
	mountertest.Run(t, false, func(t *testing.T) mountertest.Env {
		m := fakemount.New()
		var n atomic.Int64
		device := func(_ *testing.T, size int64) string {
			dev := fmt.Sprintf("/dev/csid-fake/disk-%d", n.Add(1))
			m.SetDeviceSize(dev, size)
			return dev
		}
		return mountertest.Env{
			Mounter: m,
			Dir:     t.TempDir(),
			Device:  device,
			Unreadable: func(t *testing.T) string {
				dev := device(t, 1<<30)
				m.FailProbe(dev, errors.New("injected: I/O error"))
				return dev
			},
			Regrow: func(_ *testing.T, dev string, size int64) string {
				m.SetDeviceSize(dev, size)
				return dev
			},
		}
	})
}

func TestProbeFailureClears(t *testing.T) {
	m := fakemount.New()
	ctx := context.Background()
	dev := "/dev/csid-fake/disk-1"
	target := filepath.Join(t.TempDir(), "staging")
	m.FailProbe(dev, errors.New("injected"))
	if _, err := m.FormatAndMount(ctx, dev, target, "xfs", nil, nil); !errors.Is(err, mounter.ErrProbeFailed) {
		t.Fatalf("FormatAndMount with a failing probe: %v", err)
	}
	m.FailProbe(dev, nil)
	if fsType, err := m.Filesystem(ctx, dev); err != nil || fsType != "" {
		t.Fatalf("after the failure cleared: %q, %v; want a blank device", fsType, err)
	}
	if _, err := m.FormatAndMount(ctx, dev, target, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
}

// The engine's load tests stage and publish many volumes at once: run with
// -race; every target must be gone at the end.
func TestConcurrentVolumes(t *testing.T) {
	m := fakemount.New()
	ctx := context.Background()
	dir := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			dev := fmt.Sprintf("/dev/csid-fake/disk-%d", i)
			staging := filepath.Join(dir, fmt.Sprint(i), "staging")
			target := filepath.Join(dir, fmt.Sprint(i), "target")
			if err := os.Mkdir(filepath.Dir(target), 0o750); err != nil {
				errs <- err
				return
			}
			for range 20 {
				_, formatErr := m.FormatAndMount(ctx, dev, staging, "ext4", nil, nil)
				for _, err := range []error{
					formatErr,
					m.BindMount(ctx, staging, target, false),
					m.Unmount(ctx, target),
					m.Unmount(ctx, staging),
				} {
					if err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if list, _ := m.List(ctx); len(list) != 0 {
		t.Fatalf("mounts left: %+v", list)
	}
}
