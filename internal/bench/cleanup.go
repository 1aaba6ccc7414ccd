package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// retryFor bounds how long a cleanup call is retried while the driver says
// "busy" (an op of the interrupted run still in flight: Aborted) or is
// unavailable.
const retryFor = 2 * time.Minute

// cleanup tears down every volume of the run still alive (a lifecycle cut
// short by an error or by Ctrl-C is unpublished, unstaged and detached
// first), then checks with ListVolumes that none of the volumes the run
// created is left. The journal is removed when nothing is left; otherwise
// it stays for the next run (or `csid bench --cleanup-only`).
func (r *runner) cleanup(ctx context.Context) error {
	r.mu.Lock()
	vols := make([]*volume, 0, len(r.live))
	for _, v := range r.live {
		vols = append(vols, v)
	}
	r.mu.Unlock()
	slices.SortFunc(vols, func(a, b *volume) int { return strings.Compare(a.name, b.name) })
	conc := max(fillConcurrency, slices.Max(r.cfg.Concurrency))
	r.untimed(ctx, len(vols), conc, fmt.Sprintf("cleanup: %d volumes", len(vols)), func(ctx context.Context, i int) error {
		if err := r.teardown(ctx, vols[i], r.header); err != nil {
			return fmt.Errorf("cleanup of %s: %w", vols[i].name, err)
		}
		r.gone(vols[i])
		return nil
	})

	c := &r.report.Cleanup
	r.mu.Lock()
	c.Created, c.Deleted = len(r.ids), r.deleted
	remaining := len(r.live)
	r.mu.Unlock()
	if r.caps.list {
		ids, err := r.listIDs(ctx)
		if err != nil {
			r.noteError(fmt.Errorf("cleanup: %w", err))
		} else {
			c.Verified = true
			for _, id := range ids {
				if r.ids[id] {
					c.Leftover = append(c.Leftover, id)
				}
			}
		}
	}
	clean := remaining == 0 && len(c.Leftover) == 0
	r.jrnl.close(clean)
	if !clean {
		return fmt.Errorf("%d volumes of this run could not be deleted (%d still listed); the journal %s keeps them for the next run (csid bench --cleanup-only)",
			remaining, len(c.Leftover), r.jrnl.path)
	}
	return nil
}

// recoverDeadRuns cleans up after runs against this endpoint that were
// killed before their own cleanup: it tears down the volumes their journals
// name (finding a volume whose create was in flight by creating it again
// by name, which is idempotent) and removes the journals it emptied.
func (r *runner) recoverDeadRuns(ctx context.Context) error {
	runs, err := deadRuns(r.cfg.JournalDir, r.cfg.Endpoint)
	if err != nil {
		return err
	}
	// One listing serves every dead run: tearing down one run's volumes
	// does not touch another's.
	listed := map[string]bool{}
	if len(runs) > 0 && r.caps.list {
		ids, err := r.listIDs(ctx)
		if err != nil {
			for _, d := range runs {
				d.f.Close()
			}
			return err
		}
		for _, id := range ids {
			listed[id] = true
		}
	}
	var errs []error
	for _, d := range runs {
		var vols []*volume
		for _, v := range d.volumes {
			if v.id != "" && r.caps.list && !listed[v.id] {
				continue // already gone
			}
			vols = append(vols, v)
		}
		var failures atomic.Int64
		r.untimed(ctx, len(vols), fillConcurrency, fmt.Sprintf("cleaning up a killed run: %d volumes", len(vols)),
			func(ctx context.Context, i int) error {
				if err := r.teardown(ctx, vols[i], d.header); err != nil {
					failures.Add(1)
					return fmt.Errorf("cleanup of %s (killed run, journal %s): %w", vols[i].name, d.path, err)
				}
				return nil
			})
		failed := int(failures.Load())
		if failed == 0 {
			_ = os.Remove(d.path)
		} else {
			errs = append(errs, fmt.Errorf("%d volumes of the killed run in %s could not be cleaned up", failed, d.path))
		}
		d.f.Close()
		r.report.Cleanup.Recovered += len(vols) - failed
	}
	return errors.Join(errs...)
}

// teardown undoes whatever may have been done to a volume and deletes it.
// Every step is idempotent in CSI; NotFound counts as done.
func (r *runner) teardown(ctx context.Context, v *volume, h journalHeader) error {
	if v.id == "" { // its create failed, or was cut short: find out by name
		err := r.retry(ctx, func(ctx context.Context) error {
			resp, err := r.csi.CreateVolume(ctx, createRequest(v.name, h))
			v.id = resp.GetVolume().GetVolumeId()
			return err
		})
		if err != nil {
			if retryable(err) {
				return fmt.Errorf("find the volume by name: %w", err)
			}
			return nil // refused for good: the first create made nothing either
		}
		r.mu.Lock()
		r.ids[v.id] = true
		r.mu.Unlock()
	}
	if v.published && r.caps.node {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := r.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
			return err
		}); err != nil {
			return fmt.Errorf("NodeUnpublishVolume: %w", err)
		}
		v.published = false
	}
	if v.staged && r.caps.stage {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := r.csi.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			return err
		}); err != nil {
			return fmt.Errorf("NodeUnstageVolume: %w", err)
		}
		v.staged = false
		_ = os.Remove(v.staging)
	}
	if v.ctrlPublished && r.caps.publish {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := r.csi.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: h.NodeID})
			return err
		}); err != nil {
			return fmt.Errorf("ControllerUnpublishVolume: %w", err)
		}
		v.ctrlPublished = false
	}
	if err := r.retry(ctx, func(ctx context.Context) error {
		_, err := r.csi.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
		return err
	}); err != nil {
		return fmt.Errorf("DeleteVolume: %w", err)
	}
	return nil
}

// retry calls f until it succeeds, fails with a code that retrying cannot
// cure, or retryFor has passed; NotFound is success (what is gone needs no
// undoing).
func (r *runner) retry(ctx context.Context, f func(ctx context.Context) error) error {
	deadline := time.Now().Add(retryFor)
	delay := 50 * time.Millisecond
	for {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		err := f(cctx)
		cancel()
		if err == nil || status.Code(err) == codes.NotFound {
			return nil
		}
		if !retryable(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (cleanup abandoned)", err)
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// retryable says whether a failed call may succeed later: an op of the
// volume is still in flight, the driver is busy or briefly away.
func retryable(err error) bool {
	switch status.Code(err) {
	case codes.Aborted, codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted:
		return true
	}
	return false
}

// listIDs pages through ListVolumes.
func (r *runner) listIDs(ctx context.Context) ([]string, error) {
	var ids []string
	token := ""
	for {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
		resp, err := r.csi.ListVolumes(cctx, &csi.ListVolumesRequest{MaxEntries: 1000, StartingToken: token})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ListVolumes: %w", err)
		}
		for _, e := range resp.GetEntries() {
			ids = append(ids, e.GetVolume().GetVolumeId())
		}
		if token = resp.GetNextToken(); token == "" {
			return ids, nil
		}
	}
}
