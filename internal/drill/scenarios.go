package drill

import (
	"context"

	"google.golang.org/grpc/codes"
)

// scenario drives volumes like an orchestrator. Its setup runs on an
// unarmed csid; its main part on the armed one (that is where the crash
// strikes, and what the census counts); its end, on an unarmed csid again,
// checks what the main part should have achieved (data, sizes) and brings
// everything down, so that anything left afterwards is a leak.
type scenario struct {
	Name string
	Doc  string
	// setup, main and end run in that order; any may be nil.
	setup, main, end func(ctx context.Context, c *cell) error
	// localOnly: the scenario works the local backend's state directory
	// itself (a detach behind csid's back), so it runs on no other.
	localOnly bool
}

func then(fs ...func(context.Context, *cell) error) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error {
		for _, f := range fs {
			if err := f(ctx, c); err != nil {
				return err
			}
		}
		return nil
	}
}

func create(name string, size int64) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.create(ctx, name, size, mountCap) }
}

// createBlock creates a raw block volume.
func createBlock(name string, size int64) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.create(ctx, name, size, blockCap) }
}

func write(name string) func(context.Context, *cell) error {
	return func(_ context.Context, c *cell) error { return c.writeData(name) }
}

func readBack(name string) func(context.Context, *cell) error {
	return func(_ context.Context, c *cell) error { return c.checkData(name) }
}

func size(name string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.checkSize(ctx, name) }
}

// fsck checks the volume's filesystem with e2fsck -fn (it must be
// unstaged): a crash must never leave it needing a manual fsck.
func fsck(name string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.checkFsck(ctx, name) }
}

func expand(name string, to int64, want codes.Code) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.expand(ctx, name, to, want) }
}

func do(name string, f func(*cell) func(context.Context, string) error) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return f(c)(ctx, name) }
}

// mark writes a volume's marker at the start of its device (a raw block
// volume, published); markers checks every published volume's.
func mark(name string) func(context.Context, *cell) error {
	return func(_ context.Context, c *cell) error { return c.writeMarker(name) }
}

func markers() func(context.Context, *cell) error {
	return func(_ context.Context, c *cell) error { return c.checkMarkers() }
}

// forceDetach detaches a volume's disk behind csid's back; reuse attaches
// a new raw block volume that takes the loop device it let go; refused
// publishes the force-detached volume, which must fail.
func forceDetach(name string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.forceDetach(ctx, name) }
}

func reuse(name string, size int64) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.reuse(ctx, name, size) }
}

func refused(name string) func(context.Context, *cell) error {
	return func(ctx context.Context, c *cell) error { return c.refusedPublish(ctx, name) }
}

var (
	attach = func(c *cell) func(context.Context, string) error { return c.attach }
	detach = func(c *cell) func(context.Context, string) error { return c.detach }
	del    = func(c *cell) func(context.Context, string) error { return c.delete }
	cpub   = func(c *cell) func(context.Context, string) error { return c.controllerPublish }
	stage  = func(c *cell) func(context.Context, string) error { return c.stage }
	pub    = func(c *cell) func(context.Context, string) error { return c.publish }
	unpub  = func(c *cell) func(context.Context, string) error { return c.unpublish }
	unstg  = func(c *cell) func(context.Context, string) error { return c.unstage }
	cunpub = func(c *cell) func(context.Context, string) error { return c.controllerUnpublish }
)

// Scenarios are the drill's scenarios, in the order they run.
var Scenarios = []scenario{
	{
		Name: "create", Doc: "CreateVolume",
		main: create("vol", 64*mib),
		end:  do("vol", del),
	},
	{
		Name: "publish", Doc: "ControllerPublishVolume, NodeStageVolume, NodePublishVolume",
		setup: create("vol", 64*mib),
		main:  do("vol", attach),
		end:   then(write("vol"), readBack("vol"), do("vol", detach), do("vol", del)),
	},
	{
		Name: "unpublish", Doc: "NodeUnpublishVolume, NodeUnstageVolume, ControllerUnpublishVolume",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol")),
		main:  do("vol", detach),
		end:   then(do("vol", attach), readBack("vol"), do("vol", detach), do("vol", del)),
	},
	{
		Name: "delete", Doc: "DeleteVolume",
		setup: create("vol", 64*mib),
		main:  do("vol", del),
	},
	{
		Name: "expand-detached", Doc: "ControllerExpandVolume of a detached volume",
		setup: create("vol", 64*mib),
		main:  expand("vol", 128*mib, codes.OK),
		end:   then(do("vol", attach), size("vol"), do("vol", detach), do("vol", del)),
	},
	{
		Name: "grow-at-stage", Doc: "ControllerPublish, NodeStage (grows the filesystem of a disk expanded while detached, offline), NodePublish",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol"), do("vol", detach), expand("vol", 128*mib, codes.OK)),
		main:  do("vol", attach),
		end:   then(readBack("vol"), size("vol"), do("vol", detach), fsck("vol"), do("vol", del)),
	},
	{
		Name: "expand-attached", Doc: "ControllerExpandVolume while attached (queued), unpublish (the resize runs), publish (after it)",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol")),
		main:  then(expand("vol", 128*mib, codes.FailedPrecondition), do("vol", detach), do("vol", cpub)),
		end: then(expand("vol", 128*mib, codes.OK), do("vol", stage), do("vol", pub), readBack("vol"), size("vol"),
			do("vol", detach), do("vol", del)),
	},
	{
		Name: "device-reuse", localOnly: true, Doc: "raw block volume a, staged, is force-detached behind the node's back; b takes its loop device (CreateVolume, ControllerPublish, NodeStage, NodePublish); NodePublishVolume of a is refused",
		setup: then(createBlock("a", 16*mib), do("a", attach), mark("a"), do("a", unpub), forceDetach("a")),
		main:  then(reuse("b", 16*mib), mark("b"), refused("a"), markers()),
		end: then(markers(), do("a", unstg), do("a", cunpub), do("a", attach), markers(),
			do("a", detach), do("b", detach), do("a", del), do("b", del)),
	},
	{
		Name: "snapshot", Doc: "CreateSnapshot of a detached volume holding data",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol"), do("vol", detach)),
		main:  takeSnapshot("snap", "vol"),
		end: then(restore("copy", "snap", 64*mib), do("copy", attach), readBack("copy"), do("copy", detach), do("copy", del),
			deleteSnapshot("snap"), do("vol", del)),
	},
	{
		Name: "delete-snapshot", Doc: "DeleteSnapshot",
		setup: then(create("vol", 64*mib), takeSnapshot("snap", "vol")),
		main:  deleteSnapshot("snap"),
		end:   do("vol", del),
	},
	{
		Name: "restore", Doc: "CreateVolume from a snapshot whose source volume is deleted, at a larger size (the stage grows the filesystem)",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol"), do("vol", detach), takeSnapshot("snap", "vol"), do("vol", del)),
		main:  restore("copy", "snap", 128*mib),
		end: then(do("copy", attach), readBack("copy"), size("copy"), do("copy", detach), fsck("copy"), do("copy", del),
			deleteSnapshot("snap")),
	},
	{
		Name: "snapshot-in-use", Doc: "CreateSnapshot of a published filesystem volume (the local backend freezes it for the copy where it cannot reflink)",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol")),
		main:  takeSnapshot("snap", "vol"),
		end: then(readBack("vol"), restore("copy", "snap", 64*mib), do("copy", attach), readBack("copy"), do("copy", detach), do("copy", del),
			deleteSnapshot("snap"), do("vol", detach), do("vol", del)),
	},
	{
		Name: "clone", Doc: "CreateVolume from a volume (a clone)",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol"), do("vol", detach)),
		main:  clone("copy", "vol", 64*mib),
		end:   then(do("copy", attach), readBack("copy"), do("copy", detach), do("copy", del), do("vol", del)),
	},
	{
		Name: "clone-in-use", Doc: "CreateVolume from a published filesystem volume (a clone, frozen for the copy where it cannot reflink)",
		setup: then(create("vol", 64*mib), do("vol", attach), write("vol")),
		main:  clone("copy", "vol", 64*mib),
		end: then(readBack("vol"), do("copy", attach), readBack("copy"), do("copy", detach), do("copy", del),
			do("vol", detach), do("vol", del)),
	},
}
