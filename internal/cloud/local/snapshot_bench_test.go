package local

import (
	"context"
	"crypto/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/testutil"
)

// BenchmarkSnapshotVsCp: a snapshot of a detached 1 GiB disk holding
// 200 MiB of data (50 runs of 4 MiB of random bytes, one every 20 MiB)
// against `cp --sparse=always` of the same image, and against that cp
// followed by an fsync of the copy (a snapshot is durable when its call
// returns; a cp is not), interleaved: each iteration times one of each, in
// turn, so that the machine's drift weighs on all alike. On xfs, whose cp
// (coreutils 9) clones by default, `cp --sparse=always --reflink=never`
// is timed too. It reports the medians (ms) and the ratios of the medians
// (snapshot over the baseline: below 1, the snapshot is faster). The
// state directory is on the file system of the test's temporary directory
// ("tmp": the machine's ext4 here), or on a loop-backed xfs (root only).
//
//	go test -run '^$' -bench SnapshotVsCp -benchtime 15x ./internal/cloud/local
func BenchmarkSnapshotVsCp(b *testing.B) {
	for _, fs := range []string{"tmp", "xfs"} {
		b.Run(fs, func(b *testing.B) {
			base := b.TempDir()
			if fs == "xfs" {
				base = testutil.MountFS(b, "xfs", 4<<30)
			}
			benchSnapshotVsCp(b, base)
		})
	}
}

func benchSnapshotVsCp(b *testing.B, base string) {
	ctx := context.Background()
	dir := filepath.Join(base, "state")
	c, err := Open(ctx, dir, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	op, err := c.CreateDisk(ctx, cloud.DiskSpec{Name: "pvc-bench", SizeBytes: gib})
	if err != nil {
		b.Fatal(err)
	}
	img := c.s.imagePath(diskID(op.DiskID))
	fillImage(b, openImage(b, c, op.DiskID))
	baselines := []struct {
		name string
		cmd  []string
		sync bool
	}{
		{"cp", []string{"cp", "--sparse=always"}, false},
		{"cp+fsync", []string{"cp", "--sparse=always"}, true},
	}
	if c.reflink {
		baselines = append(baselines, struct {
			name string
			cmd  []string
			sync bool
		}{"cp-noreflink", []string{"cp", "--sparse=always", "--reflink=never"}, false})
	}
	snapshots := make([]time.Duration, 0, b.N)
	copies := make([][]time.Duration, len(baselines))
	copyTo := filepath.Join(base, "copy.img")
	b.ResetTimer()
	for i := range b.N {
		start := time.Now()
		op, err := c.CreateSnapshot(ctx, cloud.SnapshotSpec{Name: "snap-bench", SourceDiskID: op.DiskID})
		snapshots = append(snapshots, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		for j, bl := range baselines {
			start := time.Now()
			out, err := exec.Command(bl.cmd[0], append(bl.cmd[1:], img, copyTo)...).CombinedOutput()
			if err == nil && bl.sync {
				err = syncFile(copyTo)
			}
			copies[j] = append(copies[j], time.Since(start))
			if err != nil {
				b.Fatalf("%v: %v\n%s", bl.cmd, err, out)
			}
			b.StopTimer()
			if err := os.Remove(copyTo); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.StopTimer()
		if i == 0 {
			snap, err := c.GetSnapshot(ctx, op.SnapshotID)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(snap.StoredBytes)/(1<<20), "stored-MiB")
		}
		if _, err := c.DeleteSnapshot(ctx, op.SnapshotID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	snap := median(snapshots)
	b.ReportMetric(ms(snap), "snapshot-ms")
	for j, bl := range baselines {
		m := median(copies[j])
		b.ReportMetric(ms(m), bl.name+"-ms")
		b.ReportMetric(float64(snap)/float64(m), "snapshot/"+bl.name)
	}
}

// fillImage writes 200 MiB of random bytes into the 1 GiB image f: 4 MiB
// every 20 MiB.
func fillImage(b *testing.B, f *os.File) {
	defer f.Close()
	chunk := make([]byte, 4<<20)
	for i := range int64(50) {
		_, _ = rand.Read(chunk)
		if _, err := f.WriteAt(chunk, i*20<<20); err != nil {
			b.Fatal(err)
		}
	}
	if err := f.Sync(); err != nil {
		b.Fatal(err)
	}
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
