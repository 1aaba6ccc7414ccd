package mounter

import (
	"context"
	"testing"

	"github.com/csid-dev/csid/internal/testutil"
)

// BenchmarkBlankProbe measures the probe of a blank 64 MiB device, fresh
// each time (a new sparse image on a new loop device, as a stage sees it):
// the blank check alone, and blkid -p as csid ran it before.
func BenchmarkBlankProbe(b *testing.B) {
	testutil.RequireRoot(b)
	for _, method := range []string{"check", "blkid"} {
		b.Run(method, func(b *testing.B) {
			sb := newSandbox(b)
			for b.Loop() {
				b.StopTimer()
				dev := sb.device(64 * mib)
				b.StartTimer()
				var err error
				switch method {
				case "check":
					_, err = zeroWhereBlkidLooks(dev)
				case "blkid":
					_, err = execRun(context.Background(), "blkid", "-p", "-s", "TYPE", "-s", "PTTYPE", "-o", "export", dev)
					if exitCode(err) == 2 {
						err = nil
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				sb.detach(dev)
				b.StartTimer()
			}
		})
	}
}
