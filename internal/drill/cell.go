package drill

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/csid-dev/csid/internal/crash"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/effects"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// cell is one run of a scenario, with csid killed at one hit of one crash
// point (or, for a census, counting the points it reaches).
type cell struct {
	binary   string
	dir      string
	cloud    *CellCloud
	scale    int64  // of the scenarios' sizes (Backend.Scale)
	point    string // "" for a census
	hit      int
	census   string // census file, for a census run
	p        *proc
	armed    bool // the running process is the armed (or counting) one
	restarts int
	vols     map[string]*volume
	snaps    map[string]*snap
	// refused are the ops the scenario expects to fail (a publish of a
	// volume whose disk is not attached): verify accepts them.
	refused []refusal
	// released is the loop device the last forced detach let go.
	released string
}

// volume is what the orchestrator remembers of a volume it drives.
type volume struct {
	id         string
	capability *csi.VolumeCapability // mountCap or blockCap
	context    map[string]string     // publish context
	size       int64
	data       []byte // written into the filesystem, checked after crashes
	marker     bool   // its marker is written at the start of its device
	published  bool   // at its target
}

func (v *volume) block() bool { return v.capability.GetBlock() != nil }

func (c *cell) env(armed bool) []string {
	switch {
	case !armed:
		return nil
	case c.census != "":
		return []string{crash.EnvCount + "=" + c.census}
	default:
		return []string{fmt.Sprintf("%s=%s:%d", crash.EnvAt, c.point, c.hit), crash.EnvLog + "=" + filepath.Join(c.dir, "fired")}
	}
}

// run starts csid unarmed or armed, stopping the one that runs.
func (c *cell) run(ctx context.Context, armed bool) error {
	if c.p != nil {
		if err := c.p.stop(); err != nil {
			return err
		}
	}
	p, err := start(ctx, c.binary, c.dir, c.cloud.Args, c.env(armed))
	if err != nil {
		return err
	}
	c.p, c.armed = p, armed
	return nil
}

// retryable are the codes a CSI sidecar treats as "may still be in progress"
// and retries with the same arguments.
func retryable(code codes.Code) bool {
	switch code {
	case codes.Aborted, codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		return true
	}
	return false
}

// call makes one CSI call the way an orchestrator does: with a deadline,
// retrying with the same arguments after a retryable error or a deadline,
// and through a crash: when csid has died (a crash point fired), it is
// started again, unarmed, and the call retried. It returns once the call
// gives want, or fails with what it got instead.
func (c *cell) call(ctx context.Context, name string, want codes.Code, fn func(context.Context, clients) error) error {
	backoff := 20 * time.Millisecond
	deadline := time.Now().Add(90 * time.Second)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
		err := fn(cctx, c.p.client)
		cancel()
		code := status.Code(err)
		if code == want {
			return nil
		}
		if code == codes.Unavailable || code == codes.Canceled || code == codes.DeadlineExceeded {
			if c.p.dead(2 * time.Second) {
				if !c.p.killedBySignal() {
					return fmt.Errorf("%s: csid exited unexpectedly (%v; see csid.log)", name, c.p.err)
				}
				c.restarts++
				if err := c.run(ctx, false); err != nil {
					return fmt.Errorf("restart after the crash: %w", err)
				}
				continue
			}
		}
		if !retryable(code) || time.Now().After(deadline) {
			return fmt.Errorf("%s: got %v, want %s", name, err, want)
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

// Kubelet-like paths of a volume's staging and target (a raw block
// volume's: a directory kubelet makes, and a file the publish makes).
func (c *cell) stagePath(name string) string {
	if v := c.vols[name]; v != nil && v.block() {
		return filepath.Join(c.dir, "kubelet/plugins/kubernetes.io/csi/volumeDevices/staging", name)
	}
	return filepath.Join(c.dir, "kubelet/plugins/kubernetes.io/csi", driver.DefaultName, name, "globalmount")
}

func (c *cell) targetPath(name string) string {
	if v := c.vols[name]; v != nil && v.block() {
		return filepath.Join(c.dir, "kubelet/plugins/kubernetes.io/csi/volumeDevices/publish", name, "pod-"+name)
	}
	return filepath.Join(c.dir, "kubelet/pods", "pod-"+name, "volumes/kubernetes.io~csi", name, "mount")
}

var (
	mountCap = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
	blockCap = &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
)

const mib = int64(1) << 20

func (c *cell) create(ctx context.Context, name string, size int64, vc *csi.VolumeCapability) error {
	size *= c.scale
	v := &volume{size: size, capability: vc}
	err := c.call(ctx, "CreateVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		resp, err := cl.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csi.VolumeCapability{vc}})
		if err == nil {
			v.id = resp.Volume.VolumeId
		}
		return err
	})
	c.vols[name] = v
	return err
}

func (c *cell) delete(ctx context.Context, name string) error {
	return c.call(ctx, "DeleteVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: c.vols[name].id})
		return err
	})
}

func (c *cell) controllerPublish(ctx context.Context, name string) error {
	v := c.vols[name]
	return c.call(ctx, "ControllerPublishVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		resp, err := cl.ControllerPublishVolume(ctx, &csi.ControllerPublishVolumeRequest{VolumeId: v.id, NodeId: NodeID, VolumeCapability: v.capability})
		if err == nil {
			v.context = resp.PublishContext
		}
		return err
	})
}

func (c *cell) controllerUnpublish(ctx context.Context, name string) error {
	return c.call(ctx, "ControllerUnpublishVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: c.vols[name].id, NodeId: NodeID})
		return err
	})
}

func (c *cell) stage(ctx context.Context, name string) error {
	v := c.vols[name]
	if err := os.MkdirAll(c.stagePath(name), 0o750); err != nil {
		return err
	}
	return c.call(ctx, "NodeStageVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: v.id, StagingTargetPath: c.stagePath(name),
			VolumeCapability: v.capability, PublishContext: v.context})
		return err
	})
}

func (c *cell) unstage(ctx context.Context, name string) error {
	return c.call(ctx, "NodeUnstageVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: c.vols[name].id, StagingTargetPath: c.stagePath(name)})
		return err
	})
}

func (c *cell) publish(ctx context.Context, name string) error {
	if err := c.publishAt(ctx, name, c.targetPath(name), codes.OK); err != nil {
		return err
	}
	c.vols[name].published = true
	return nil
}

// publishAt publishes a volume at target; want is the answer expected.
func (c *cell) publishAt(ctx context.Context, name, target string, want codes.Code) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
		return err
	}
	v := c.vols[name]
	return c.call(ctx, "NodePublishVolume "+name, want, func(ctx context.Context, cl clients) error {
		_, err := cl.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: v.id, TargetPath: target,
			StagingTargetPath: c.stagePath(name), VolumeCapability: v.capability})
		return err
	})
}

func (c *cell) unpublish(ctx context.Context, name string) error {
	c.vols[name].published = false
	return c.call(ctx, "NodeUnpublishVolume "+name, codes.OK, func(ctx context.Context, cl clients) error {
		_, err := cl.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: c.vols[name].id, TargetPath: c.targetPath(name)})
		return err
	})
}

// expand asks for size; want is FailedPrecondition while the volume is
// attached (the resize is queued), OK once it has run.
func (c *cell) expand(ctx context.Context, name string, size int64, want codes.Code) error {
	size *= c.scale
	v := c.vols[name]
	return c.call(ctx, fmt.Sprintf("ControllerExpandVolume %s to %d", name, size), want, func(ctx context.Context, cl clients) error {
		resp, err := cl.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: v.id,
			CapacityRange: &csi.CapacityRange{RequiredBytes: size}, VolumeCapability: v.capability})
		if err == nil && resp.CapacityBytes < size {
			return status.Errorf(codes.Internal, "expand answered OK at %d bytes, want %d", resp.CapacityBytes, size)
		}
		if err == nil {
			v.size = resp.CapacityBytes
		}
		return err
	})
}

// attach brings a volume up to PUBLISHED: attach, stage, publish.
func (c *cell) attach(ctx context.Context, name string) error {
	for _, f := range []func(context.Context, string) error{c.controllerPublish, c.stage, c.publish} {
		if err := f(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// detach brings a published volume down to CREATED.
func (c *cell) detach(ctx context.Context, name string) error {
	for _, f := range []func(context.Context, string) error{c.unpublish, c.unstage, c.controllerUnpublish} {
		if err := f(ctx, name); err != nil {
			return err
		}
	}
	return nil
}

// writeData writes a file into the published volume and syncs it: data the
// user was told is written must survive every crash.
func (c *cell) writeData(name string) error {
	v := c.vols[name]
	v.data = []byte(fmt.Sprintf("drill data of %s (%s)\n", name, v.id))
	f, err := os.Create(filepath.Join(c.targetPath(name), "drill-data"))
	if err != nil {
		return err
	}
	if _, err := f.Write(v.data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// checkData reads the file back from the published volume.
func (c *cell) checkData(name string) error {
	v := c.vols[name]
	if v.data == nil {
		return nil
	}
	got, err := os.ReadFile(filepath.Join(c.targetPath(name), "drill-data"))
	if err != nil {
		return fmt.Errorf("data written to %s before the crash: %w", name, err)
	}
	if !bytes.Equal(got, v.data) {
		return fmt.Errorf("data written to %s before the crash reads %q, want %q", name, got, v.data)
	}
	return nil
}

// checkFsck runs e2fsck -fn on the image of the volume's disk (detached,
// or at least unstaged): it must find nothing to repair.
func (c *cell) checkFsck(ctx context.Context, name string) error {
	v := c.vols[name]
	img, err := c.cloud.ImagePath(v.context[effects.PublishContextDiskID])
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "e2fsck", "-fn", img).CombinedOutput()
	if err != nil || strings.Contains(string(out), "? no") {
		return fmt.Errorf("e2fsck -fn of %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// checkSize checks that the staged filesystem fills the volume's size.
func (c *cell) checkSize(ctx context.Context, name string) error {
	v := c.vols[name]
	var total int64
	err := c.call(ctx, "NodeGetVolumeStats "+name, codes.OK, func(ctx context.Context, cl clients) error {
		resp, err := cl.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: c.targetPath(name)})
		if err == nil && len(resp.Usage) > 0 {
			total = resp.Usage[0].Total
		}
		return err
	})
	if err != nil {
		return err
	}
	if total < v.size*8/10 {
		return fmt.Errorf("the filesystem of %s is %d bytes on a %d-byte volume: not grown", name, total, v.size)
	}
	return nil
}
