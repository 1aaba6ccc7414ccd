package drill

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/effects"
	"github.com/csid-dev/csid/internal/fsm"
	"google.golang.org/grpc/codes"
)

// The steps of the device-reuse scenario: a disk detached behind the
// node's back while staged, its loop device taken by the next volume's,
// and a marker unique to each volume at the start of its device.

// deviceOf is the loop device bound to a volume's disk ("" for none).
func (c *cell) deviceOf(ctx context.Context, name string) (string, error) {
	in, err := local.OpenInspector(c.dir)
	if err != nil {
		return "", err
	}
	devs, err := in.LoopDevices(ctx)
	if err != nil {
		return "", err
	}
	if d := devs[c.vols[name].context[effects.PublishContextDiskID]]; len(d) > 0 {
		return d[0], nil
	}
	return "", nil
}

// forceDetach detaches a volume's disk from the node behind csid's back,
// as a cloud console's force detach does while the node still has it
// staged: through the local backend directly, which releases the loop
// device (nothing holds it: a raw block volume's staging mounts nothing).
// The device is remembered as released.
func (c *cell) forceDetach(ctx context.Context, name string) error {
	dev, err := c.deviceOf(ctx, name)
	if err != nil {
		return err
	}
	cl, err := local.Open(ctx, c.dir, local.Options{})
	if err != nil {
		return err
	}
	defer cl.Close()
	op, err := cl.DetachDisk(ctx, c.vols[name].context[effects.PublishContextDiskID], NodeID)
	if err == nil {
		_, err = cl.WaitOperation(ctx, op.ID)
	}
	if err != nil {
		return fmt.Errorf("force detach of %s: %w", name, err)
	}
	c.released = dev
	return nil
}

// maxReuseTries bounds how many volumes reuse attaches to get the
// released device.
const maxReuseTries = 3

// reuse creates, attaches and publishes raw block volume name until it
// gets the loop device the last force detach released: a volume that got
// another one (another process took the device first) is brought down
// and deleted, and the next takes its name. After maxReuseTries, the last
// stays, on whatever device it has: the checks hold either way.
func (c *cell) reuse(ctx context.Context, name string, size int64) error {
	for try := 1; ; try++ {
		if err := c.create(ctx, name, size, blockCap); err != nil {
			return err
		}
		if err := c.attach(ctx, name); err != nil {
			return err
		}
		dev, err := c.deviceOf(ctx, name)
		if err != nil || dev == c.released || try == maxReuseTries {
			return err
		}
		if err := c.detach(ctx, name); err != nil {
			return err
		}
		if err := c.delete(ctx, name); err != nil {
			return err
		}
	}
}

// writeMarker writes the volume's marker at the start of its device,
// through its (raw block) target.
func (c *cell) writeMarker(name string) error {
	v := c.vols[name]
	v.marker = true
	return WriteMarker(c.targetPath(name), v.id, 16)
}

// checkMarkers reads the start of every published volume that has a
// marker, through its target: each reads its own volume's marker, never
// another's.
func (c *cell) checkMarkers() error {
	for name, v := range c.vols {
		if !v.marker || !v.published {
			continue
		}
		got, err := ReadMarker(c.targetPath(name))
		if err != nil {
			return err
		}
		if got != v.id {
			return fmt.Errorf("the target of %s (%s) reads the marker of %q, not its own", name, v.id, got)
		}
	}
	return nil
}

// refusedPublish publishes a volume whose disk is not attached (force
// detached) at a new target: it must be refused (FailedPrecondition), and
// nothing may appear there. The failed op is one verify expects.
func (c *cell) refusedPublish(ctx context.Context, name string) error {
	v := c.vols[name]
	c.refused = append(c.refused, refusal{volumeID: v.id, event: fsm.NodePublish, code: codes.FailedPrecondition.String()})
	target := c.targetPath(name) + "-again"
	if err := c.publishAt(ctx, name, target, codes.FailedPrecondition); err != nil {
		return err
	}
	if _, err := os.Lstat(target); !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the refused publish of %s left %s behind (%v)", name, target, err)
	}
	return nil
}
