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
// first), then checks with ListVolumes, on each endpoint, that none of the
// volumes the run created is left. An endpoint's journal is removed when
// nothing of it is left; otherwise it stays for the next run (or `csid
// bench --cleanup-only`).
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
		if err := r.teardown(ctx, vols[i].ep, vols[i], vols[i].ep.header); err != nil {
			return fmt.Errorf("cleanup of %s%s: %w", vols[i].name, vols[i].ep.suffix(), err)
		}
		r.gone(vols[i])
		return nil
	})

	c := &r.report.Cleanup
	c.Verified = true
	var errs []error
	for _, ep := range r.eps {
		if err := r.verify(ctx, ep); err != nil {
			errs = append(errs, err)
		}
	}
	r.mu.Lock()
	c.Deleted = r.deleted
	r.mu.Unlock()
	return errors.Join(errs...)
}

// verify counts what the run created on ep, asks ListVolumes (if ep has
// it) which of those are left, and closes ep's journal, removing it when
// nothing of ep is left (for the endpoint under test, nor the floors'
// scratch directory).
func (r *runner) verify(ctx context.Context, ep *endpoint) error {
	c := &r.report.Cleanup
	r.mu.Lock()
	c.Created += len(ep.ids)
	remaining := 0
	for _, v := range r.live {
		if v.ep == ep {
			remaining++
		}
	}
	r.mu.Unlock()
	leftover := 0
	if !ep.caps.list {
		c.Verified = false
	} else if ids, err := ep.listIDs(ctx, r.cfg.Timeout); err != nil {
		c.Verified = false
		r.noteError(fmt.Errorf("cleanup: %w", err))
	} else {
		r.mu.Lock()
		for _, id := range ids {
			if ep.ids[id] {
				c.Leftover = append(c.Leftover, id)
				leftover++
			}
		}
		r.mu.Unlock()
	}
	clean := remaining == 0 && leftover == 0
	ep.jrnl.close(clean && !(ep == r.eps[0] && r.scratchLeft))
	if !clean {
		return fmt.Errorf("%d volumes of this run on %s could not be deleted (%d still listed); the journal %s keeps them for the next run (csid bench --cleanup-only)",
			remaining, ep.role(), leftover, ep.jrnl.path)
	}
	return nil
}

// recoverDeadRuns cleans up, on each endpoint, after runs that were killed
// before their own cleanup.
func (r *runner) recoverDeadRuns(ctx context.Context) error {
	var errs []error
	for _, ep := range r.eps {
		if err := r.recoverDeadRunsOf(ctx, ep); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// recoverDeadRunsOf cleans up after runs against ep that were killed
// before their own cleanup: it tears down the volumes their journals name
// (finding a volume whose create was in flight by creating it again by
// name, which is idempotent), undoes what their floors left (a mounted
// image on a loop device: see recoverScratch), and removes the journals it
// emptied.
func (r *runner) recoverDeadRunsOf(ctx context.Context, ep *endpoint) error {
	runs, err := deadRuns(r.cfg.JournalDir, ep.addr)
	if err != nil {
		return err
	}
	// One listing serves every dead run: tearing down one run's volumes
	// does not touch another's.
	listed := map[string]bool{}
	if len(runs) > 0 && ep.caps.list {
		ids, err := ep.listIDs(ctx, r.cfg.Timeout)
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
			if v.id != "" && ep.caps.list && !listed[v.id] {
				continue // already gone
			}
			vols = append(vols, v)
		}
		var failures atomic.Int64
		r.untimed(ctx, len(vols), fillConcurrency, fmt.Sprintf("cleaning up a killed run: %d volumes", len(vols)),
			func(ctx context.Context, i int) error {
				if err := r.teardown(ctx, ep, vols[i], d.header); err != nil {
					failures.Add(1)
					return fmt.Errorf("cleanup of %s (killed run, journal %s): %w", vols[i].name, d.path, err)
				}
				return nil
			})
		failed := int(failures.Load())
		var scratchErr error
		if d.scratch != "" {
			if scratchErr = recoverScratch(ctx, d.scratch); scratchErr != nil {
				errs = append(errs, fmt.Errorf("the floors of the killed run in %s: %w", d.path, scratchErr))
			}
		}
		switch {
		case failed > 0:
			errs = append(errs, fmt.Errorf("%d volumes of the killed run in %s could not be cleaned up", failed, d.path))
		case scratchErr == nil:
			_ = os.Remove(d.path)
		}
		d.f.Close()
		r.report.Cleanup.Recovered += len(vols) - failed
	}
	return errors.Join(errs...)
}

// teardown undoes whatever may have been done to a volume on ep and
// deletes it. Every step is idempotent in CSI; NotFound counts as done.
func (r *runner) teardown(ctx context.Context, ep *endpoint, v *volume, h journalHeader) error {
	if v.id == "" { // its create failed, or was cut short: find out by name
		err := r.retry(ctx, func(ctx context.Context) error {
			resp, err := ep.csi.CreateVolume(ctx, createRequest(v.name, h))
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
		ep.ids[v.id] = true
		r.mu.Unlock()
	}
	if v.published && ep.caps.node {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := ep.csi.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target})
			return err
		}); err != nil {
			return fmt.Errorf("NodeUnpublishVolume: %w", err)
		}
		v.published = false
	}
	if v.staged && ep.caps.stage {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := ep.csi.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			return err
		}); err != nil {
			return fmt.Errorf("NodeUnstageVolume: %w", err)
		}
		v.staged = false
		_ = os.Remove(v.staging)
	}
	if v.ctrlPublished && ep.caps.publish {
		if err := r.retry(ctx, func(ctx context.Context) error {
			_, err := ep.csi.ControllerUnpublishVolume(ctx, &csi.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: h.NodeID})
			return err
		}); err != nil {
			return fmt.Errorf("ControllerUnpublishVolume: %w", err)
		}
		v.ctrlPublished = false
	}
	if err := r.retry(ctx, func(ctx context.Context) error {
		_, err := ep.csi.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: v.id})
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
