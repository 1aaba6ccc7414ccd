package local

import (
	"context"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/csid-dev/csid/internal/testutil"
)

// The node binds a disk's image with direct I/O where the state
// directory's file system does it at 512 bytes (see BindOptions), at the
// disk's size; elsewhere buffered.
func TestHostBindsWithDirectIO(t *testing.T) {
	testutil.RequireRoot(t)
	c := open(t, newDir(t), Options{})
	d := attached(t, c, 16*mib)
	if _, err := devicePath(context.Background(), c.Host("node-a"), d.ID); err != nil {
		t.Fatal(err)
	}
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, c.s.imagePath(diskID(d.ID)), 0, unix.STATX_DIOALIGN, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mask&unix.STATX_DIOALIGN == 0 {
		t.Skip("the kernel does not say the image's direct I/O alignment (STATX_DIOALIGN: Linux 6.1)")
	}
	align := st.Dio_offset_align
	devs := loopsOf(t, c, d.ID)
	if want := align != 0 && align <= 512; len(devs) != 1 || devs[0].DirectIO != want || devs[0].SizeBytes != 16*mib {
		t.Fatalf("devices %+v of an image whose direct I/O aligns to %d bytes, want one of 16 MiB, direct I/O %v", devs, align, want)
	}
}
