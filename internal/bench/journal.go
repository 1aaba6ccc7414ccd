package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// A journal records, for one run, every volume the run is about to create
// and has created, so that a later run can clean up after a run that was
// killed (SIGKILL, a crash, a second Ctrl-C): CSI's ListVolumes reports
// volume ids, not the names that carry the run's prefix, and a volume
// whose CreateVolume was in flight has no id the run knows of.
//
// It is a JSON-lines file, <dir>/<run id>.journal: a header naming the
// endpoint and the creation arguments, then one line per event. A live run
// holds an exclusive flock on its journal; a journal nobody holds belongs
// to a dead run. Lines are written with one write(2) each and not fsynced:
// they survive the bench's death, not the machine's.
type journal struct {
	mu   sync.Mutex
	f    *os.File
	path string
}

// journalHeader is a journal's first line: what a later run needs to find
// (CreateVolume again, by name: idempotent) and tear down the run's volumes.
type journalHeader struct {
	Endpoint string `json:"endpoint"`
	NodeID   string `json:"node_id,omitempty"`
	// Topology is the node's, asked for in CreateVolume when the driver
	// has topology.
	Topology   map[string]string `json:"topology,omitempty"`
	SizeBytes  int64             `json:"size_bytes"`
	AccessType string            `json:"access_type"`
	FsType     string            `json:"fs_type,omitempty"`
	Parameters map[string]string `json:"parameters,omitempty"`
	PID        int               `json:"pid"`
}

// journalLine is one event: a create about to be sent (Begin, with the
// paths the volume will be staged and published at), a create answered
// (Created, with the id), a volume deleted (Deleted), the floors' scratch
// directory about to be made (Scratch; see scratch.go).
type journalLine struct {
	Begin   string `json:"begin,omitempty"`
	Staging string `json:"staging,omitempty"`
	Target  string `json:"target,omitempty"`
	Created string `json:"created,omitempty"`
	ID      string `json:"id,omitempty"`
	Deleted string `json:"deleted,omitempty"`
	Scratch string `json:"scratch,omitempty"`
}

const journalExt = ".journal"

// createJournal makes and locks the journal of run id in dir.
func createJournal(dir, id string, h journalHeader) (*journal, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("journal directory: %w", err)
	}
	path := filepath.Join(dir, id+journalExt)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("journal: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock journal %s: %w", path, err)
	}
	j := &journal{f: f, path: path}
	if err := j.write(h); err != nil {
		j.close(true)
		return nil, err
	}
	return j, nil
}

func (j *journal) write(v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.f.Write(append(raw, '\n')); err != nil {
		return fmt.Errorf("journal %s: %w", j.path, err)
	}
	return nil
}

// close releases the journal; remove deletes it (the run left nothing).
func (j *journal) close(remove bool) {
	if remove {
		_ = os.Remove(j.path)
	}
	_ = j.f.Close() // releases the flock
}

// deadRun is what a journal of a dead run says is left.
type deadRun struct {
	path   string
	f      *os.File // holds the flock while this run cleans up
	header journalHeader
	// volumes not recorded as deleted, by name.
	volumes map[string]*volume
	// scratch is the floors' scratch directory the run made, if any.
	scratch string
}

// deadRuns finds the journals in dir of runs against endpoint that are no
// longer running, and locks them. Journals of live runs, of other
// endpoints, and unreadable ones are left alone.
func deadRuns(dir, endpoint string) ([]*deadRun, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("journal directory: %w", err)
	}
	var out []*deadRun
	for _, e := range entries {
		if !e.Type().IsRegular() || !strings.HasSuffix(e.Name(), journalExt) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
		if err != nil {
			continue
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close() // a live run
			continue
		}
		d, err := readJournal(f)
		if err != nil || grpcTarget(d.header.Endpoint) != grpcTarget(endpoint) {
			f.Close()
			continue
		}
		d.path, d.f = path, f
		out = append(out, d)
	}
	return out, nil
}

func readJournal(f *os.File) (*deadRun, error) {
	d := &deadRun{volumes: map[string]*volume{}}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() {
		return nil, errors.New("empty journal")
	}
	if err := json.Unmarshal(sc.Bytes(), &d.header); err != nil {
		return nil, err
	}
	for sc.Scan() {
		var l journalLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			break // a line cut short by the crash: the rest is unknown
		}
		switch {
		case l.Begin != "":
			// Nothing says how far a lifecycle got: undo every step.
			d.volumes[l.Begin] = &volume{name: l.Begin, staging: l.Staging, target: l.Target,
				ctrlPublished: l.Target != "", staged: l.Staging != "", published: l.Target != ""}
		case l.Created != "":
			if v := d.volumes[l.Created]; v != nil {
				v.id = l.ID
			}
		case l.Deleted != "":
			delete(d.volumes, l.Deleted)
		case l.Scratch != "":
			d.scratch = l.Scratch
		}
	}
	return d, sc.Err()
}
