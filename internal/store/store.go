// Package store keeps csid's durable state in one bbolt file: volume and
// snapshot records, ops (ordered by sequence), the deferred resize queue, a
// bounded history per volume and snapshot, and the schema version. It holds no business rules: it reads and
// writes typed records, and makes a volume change atomic with its op and its
// history entry.
//
// Writers go through Update, which coalesces concurrent callers into one
// bbolt transaction (group commit) without waiting for company: a lone
// writer commits at once, and callers that arrive while a commit is in
// progress share the next one.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/csid-dev/csid/internal/boltfile"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
	"golang.org/x/sys/unix"
)

// SchemaVersion is the layout this build reads and writes: 2 seals every
// record with a checksum (codec.go); 3 adds the snapshot records (their
// own buckets). Open migrates a file of an older version in the
// transaction that opens it: version 1 (the same records, unsealed) is
// sealed, and a file without the snapshot buckets gets them, empty.
const SchemaVersion = 3

// schemaUnsealed is the last layout without checksums.
const schemaUnsealed = 1

// schemaSnapshots is the first layout with the snapshot buckets.
const schemaSnapshots = 3

// Buckets.
var (
	bucketMeta    = []byte("meta")
	bucketVolumes = []byte("volumes")
	bucketNames   = []byte("names")
	bucketOps     = []byte("ops")
	bucketActive  = []byte("active")
	bucketResize  = []byte("resize")
	bucketHistory = []byte("history")
	// The snapshot records and their name index (schema 3). A snapshot's
	// op in flight is marked in the active bucket and its notes are kept
	// in the history bucket, as a volume's: snapshot and volume ids are
	// one namespace (the store refuses a record whose id the other kind
	// holds).
	bucketSnapshots = []byte("snapshots")
	bucketSnapNames = []byte("snapnames")
	allBuckets      = [][]byte{bucketMeta, bucketVolumes, bucketNames, bucketOps, bucketActive, bucketResize, bucketHistory,
		bucketSnapshots, bucketSnapNames}
	// snapshotBuckets are the buckets a file of a schema before
	// schemaSnapshots lacks.
	snapshotBuckets = [][]byte{bucketSnapshots, bucketSnapNames}
	keySchema       = []byte("schema")
	// keyNew marks a file Open started (from nothing, or from an empty
	// file) until the caller confirms it (Confirm).
	keyNew    = []byte("new")
	keyPruned = []byte("pruned")
)

// Errors.
var (
	// ErrSchema: the file was written by a csid with another layout.
	ErrSchema = errors.New("unsupported state file schema")
	// ErrCorrupt: the file is not a readable csid state file.
	ErrCorrupt = errors.New("state file is not a readable csid state file")
	// ErrLocked: another process holds the file.
	ErrLocked = errors.New("state file is locked by another process")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("store is closed")
	// ErrNotFound: a record does not exist.
	ErrNotFound = errors.New("record not found")
)

// Options tune a Store.
type Options struct {
	// LockTimeout bounds the wait for the file lock (default 1s).
	LockTimeout time.Duration
	// HistoryLimit is the number of history lines History returns per
	// volume, and the number of notes kept per volume (default 100).
	HistoryLimit int
	// OpRetention is the number of recent ops kept (default 10000); older
	// finished ops are pruned as new ones finish, except each volume's last.
	OpRetention uint64
	// MaxBatch caps the number of callers sharing one commit (default 256).
	MaxBatch int
	// GatherWindow is the most a leader waits, after a shared commit, for
	// as many callers as shared it before it commits (default 200µs; see
	// Update).
	GatherWindow time.Duration
	// NoSync skips fsync (tests and benchmarks of logic only; never in a
	// driver).
	NoSync bool
	// Observe, if set, is called after every commit with the number of
	// callers it served and its duration.
	Observe func(batch int, took time.Duration)

	// WatchInterval is how often the file watch compares the open file
	// with its path (default 1s).
	WatchInterval time.Duration
	// OnFileFault, if set, is called (from the watch) when the watch finds
	// the file removed, replaced or cut short, or finds another problem
	// than the last: the error says what happened and what to do.
	OnFileFault func(error)

	// pageSize is the page size of a new file (tests: small fuzz seeds);
	// 0 is bbolt's default, the OS page size.
	pageSize int
}

func (o *Options) defaults() {
	if o.LockTimeout <= 0 {
		o.LockTimeout = time.Second
	}
	if o.HistoryLimit <= 0 {
		o.HistoryLimit = 100
	}
	if o.OpRetention == 0 {
		o.OpRetention = 10000
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 256
	}
	if o.GatherWindow <= 0 {
		o.GatherWindow = 200 * time.Microsecond
	}
	if o.WatchInterval <= 0 {
		o.WatchInterval = time.Second
	}
}

// Store is an open state file.
type Store struct {
	db       *bolt.DB
	path     string
	opts     Options
	readOnly bool
	// migratedFrom is the schema Open migrated the file from (0: none).
	migratedFrom uint64
	// created says Open found no file, or an empty one.
	created bool
	// watch compares the open file with its path (nil when read-only).
	watch *fileWatch
	// volumes caches decoded volume records by their encoded bytes.
	volumes volumeCache

	// cmu guards the commit queue; idle is signalled when no commit is in
	// progress (see Update).
	cmu     sync.Mutex
	idle    sync.Cond
	queue   []*call
	leading bool
	cclosed bool
	// lastBatch is how many callers the last successful commit served
	// (more than one: it was shared); grew wakes a leader gathering
	// callers when one joins the queue.
	lastBatch atomic.Int64
	grew      chan struct{}

	// health holds what keeps the store from taking writes (Health).
	health health

	closeOnce sync.Once
	closeErr  error
}

// Open opens (or creates) the state file at path for reading and writing.
// A file that is not a csid state file, or has another schema version, is an
// error; it is never recreated. A file locked by another process is an
// ErrLocked error naming the holder, returned within opts.LockTimeout.
func Open(path string, opts Options) (*Store, error) {
	opts.defaults()
	fresh, created, migrated := false, false, uint64(0)
	if st, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		fresh, created = true, true
	} else if err == nil && st.Mode().IsRegular() && st.Size() == 0 {
		created = true
	} else if err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	} else if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("state file %s: not a regular file: %w", path, ErrCorrupt)
	}
	db, file, err := openBolt(path, &bolt.Options{
		Timeout:        opts.LockTimeout,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		NoSync:         opts.NoSync,
		PageSize:       opts.pageSize,
	})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			empty := true
			_ = tx.ForEach(func([]byte, *bolt.Bucket) error { empty = false; return nil })
			if !fresh && !empty {
				return fmt.Errorf("state file %s has no csid metadata: %w", path, ErrCorrupt)
			}
			for _, b := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(b); err != nil {
					return err
				}
			}
			if err := tx.Bucket(bucketMeta).Put(keyNew, u64(1)); err != nil {
				return err
			}
			return tx.Bucket(bucketMeta).Put(keySchema, u64(SchemaVersion))
		}
		created = created || meta.Get(keyNew) != nil
		v, err := checkSchema(path, meta, schemaUnsealed)
		if err != nil {
			return err
		}
		if err := checkBuckets(path, tx, v); err != nil {
			return err
		}
		if v != SchemaVersion {
			migrated = v
			return migrate(tx, v)
		}
		return nil
	})
	var watch *fileWatch
	if err == nil {
		watch, err = newFileWatch(file)
	}
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db, path: path, opts: opts, migratedFrom: migrated, created: created, watch: watch, grew: make(chan struct{}, 1)}
	s.idle.L = &s.cmu
	s.health.init()
	s.health.probes.Add(1)
	go s.watchFile()
	return s, nil
}

// Created reports whether the file is new: Open found no file at its path,
// or an empty one, and started it; or an earlier Open did and nobody
// confirmed it since (Confirm). A csid that finds it has held volumes
// refuses a new file: it replaces one that was lost.
func (s *Store) Created() bool { return s.created }

// Confirm records that the new file is the state file from now on: later
// opens no longer report it Created.
func (s *Store) Confirm() error {
	err := s.Update(func(tx *Tx) error { return tx.tx.Bucket(bucketMeta).Delete(keyNew) })
	if err == nil {
		s.created = false
	}
	return err
}

// OpenReadOnly opens an existing state file for inspection. It never creates
// or modifies the file. A file held by a running csid is an ErrLocked error
// within opts.LockTimeout (default 1s).
func OpenReadOnly(path string, opts Options) (*Store, error) {
	opts.defaults()
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("state file %s: %w", path, err)
	}
	db, _, err := openBolt(path, &bolt.Options{ReadOnly: true, Timeout: opts.LockTimeout})
	if err != nil {
		return nil, err
	}
	err = db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if meta == nil {
			return fmt.Errorf("state file %s has no csid metadata: %w", path, ErrCorrupt)
		}
		v, err := checkSchema(path, meta, schemaUnsealed)
		if err == nil && v == schemaUnsealed {
			err = fmt.Errorf("state file %s has schema version %d (records without checksums), and this csid reads version %d: "+
				"start csid serve on it once, which migrates it in place, or read it with the csid that wrote it: %w",
				path, v, SchemaVersion, ErrSchema)
		}
		if err == nil {
			// A file of schema 2 reads as it is: it has no snapshots.
			err = checkBuckets(path, tx, v)
		}
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	s := &Store{db: db, path: path, opts: opts, readOnly: true}
	s.idle.L = &s.cmu
	s.health.init()
	return s, nil
}

// openBolt opens the file with bbolt, after checking its structure with
// plain reads (internal/boltfile): bbolt asserts what it reads, some of its
// assertions fire on goroutines of its own or as faults past the end of a
// short file, and none of those can be recovered. What is left (a panic or
// a fault on this goroutine) is recovered all the same, as a damaged file.
func openBolt(path string, o *bolt.Options) (db *bolt.DB, file *os.File, err error) {
	if err := verifyFile(path); err != nil {
		return nil, nil, err
	}
	o.OpenFile = func(name string, flag int, perm os.FileMode) (*os.File, error) {
		f, err := os.OpenFile(name, flag, perm)
		file = f
		return f, err
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if file != nil {
				file.Close() // releases the lock; the mapping is lost with the panic
			}
			db, file, err = nil, nil, damagedError(path, fmt.Errorf("bbolt: %v", r))
		}
	}()
	db, err = bolt.Open(path, 0o600, o)
	if err == nil {
		return db, file, nil
	}
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, nil, &LockedError{Path: path, Holder: lockHolder(path)}
	}
	if errors.Is(err, os.ErrPermission) || errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("state file %s: %w", path, err)
	}
	return nil, nil, damagedError(path, err)
}

// verifyFile checks the structure of the file at path under a shared lock,
// so that no csid writes it meanwhile. A file another process holds for
// writing is a LockedError at once: a csid holds its file for its life. A
// missing file is not an error (Open creates it).
func verifyFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("state file %s: %w", path, err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return &LockedError{Path: path, Holder: lockHolder(path)}
	} else if err != nil {
		return fmt.Errorf("state file %s: lock: %w", path, err)
	}
	if err := boltfile.Verify(f); err != nil {
		if errors.Is(err, boltfile.ErrDamaged) {
			return damagedError(path, err)
		}
		return fmt.Errorf("state file %s: %w", path, err)
	}
	return nil
}

// damagedError is the refusal of a file that is not a readable csid state
// file: what is wrong, and what to do.
func damagedError(path string, why error) error {
	return fmt.Errorf("state file %s: %v: %w (csid does not recreate it: "+
		"see what is wrong with `csid state verify --db %s`, then restore a backup, "+
		"or move it aside and start csid with --rebuild-from-cloud; docs/operations.md, \"A damaged state file\")",
		path, why, ErrCorrupt, path)
}

// checkSchema returns the file's schema version: SchemaVersion, or a
// version from oldest up that the caller migrates; any other is an error.
func checkSchema(path string, meta *bolt.Bucket, oldest uint64) (uint64, error) {
	v := meta.Get(keySchema)
	if len(v) != 8 {
		return 0, fmt.Errorf("state file %s has no schema version: %w", path, ErrCorrupt)
	}
	got := fromU64(v)
	if got != SchemaVersion && (got < oldest || got > SchemaVersion) {
		return 0, fmt.Errorf("state file %s has schema version %d, this csid reads version %d: %w", path, got, SchemaVersion, ErrSchema)
	}
	return got, nil
}

// checkBuckets checks that a file of schema v has every bucket of its
// layout (a file before schemaSnapshots has no snapshot buckets).
func checkBuckets(path string, tx *bolt.Tx, v uint64) error {
	for _, b := range allBuckets {
		if tx.Bucket(b) == nil && (v >= schemaSnapshots || !slices.ContainsFunc(snapshotBuckets, func(x []byte) bool { return bytes.Equal(x, b) })) {
			return fmt.Errorf("state file %s lacks bucket %q: %w", path, b, ErrCorrupt)
		}
	}
	return nil
}

// migrate brings a file of schema from (older than SchemaVersion) to
// SchemaVersion, in the transaction that opens it: a file of schema 1 is
// sealed; one before schemaSnapshots gets the snapshot buckets, empty.
func migrate(tx *bolt.Tx, from uint64) error {
	if from == schemaUnsealed {
		if err := sealAll(tx); err != nil {
			return err
		}
	}
	for _, b := range snapshotBuckets {
		if _, err := tx.CreateBucketIfNotExists(b); err != nil {
			return err
		}
	}
	return tx.Bucket(bucketMeta).Put(keySchema, u64(SchemaVersion))
}

// sealAll seals every record of a file of schema 1 as it is (an unreadable
// one is sealed unreadable, and found damaged when read).
func sealAll(tx *bolt.Tx) error {
	for _, name := range sealedBuckets {
		if tx.Bucket(name) == nil {
			continue // a snapshot bucket, which schema 1 has not
		}
		b := tx.Bucket(name)
		var keys, values [][]byte
		err := b.ForEach(func(k, v []byte) error {
			if v == nil {
				return fmt.Errorf("bucket %s holds a bucket %q: %w", name, k, ErrCorrupt)
			}
			keys, values = append(keys, bytes.Clone(k)), append(values, bytes.Clone(v))
			return nil
		})
		if err != nil {
			return err
		}
		for i, k := range keys {
			if err := b.Put(k, seal(k, values[i])); err != nil {
				return err
			}
		}
	}
	return nil
}

// MigratedFrom is the schema version Open migrated the file from, or 0.
func (s *Store) MigratedFrom() int { return int(s.migratedFrom) }

// LockedError says who holds a state file.
type LockedError struct {
	Path string
	// Holder describes the process holding the lock ("pid 42 (csid serve
	// ...)"), or is empty when it cannot be found.
	Holder string
}

func (e *LockedError) Error() string {
	who := "another process"
	if e.Holder != "" {
		who = e.Holder
	}
	return fmt.Sprintf("state file %s is in use by %s", e.Path, who)
}

// Unwrap makes errors.Is(err, ErrLocked) true.
func (e *LockedError) Unwrap() error { return ErrLocked }

// Path is the file the store was opened from.
func (s *Store) Path() string { return s.path }

// View runs fn in a read-only transaction. Views run concurrently with each
// other and with the committer. A file cut short under csid is not read
// (its pages past the cut would fault): View returns the watch's finding.
// A fault while reading (the file cut before the watch saw it) is an error
// too, not a crash.
func (s *Store) View(fn func(tx *Tx) error) error {
	if err := s.fileCut(); err != nil {
		return err
	}
	return s.boltTx(false, func(btx *bolt.Tx) error { return fn(&Tx{tx: btx, s: s}) })
}

// boltTx runs fn in a bbolt transaction (writable: db.Update, else
// db.View), turning a memory fault reading the mapped file (a read past
// the end of a file cut short under csid) into an error saying what
// happened; other panics go on.
func (s *Store) boltTx(writable bool, fn func(*bolt.Tx) error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if !isFault(r) {
				panic(r)
			}
			err = s.faulted(r)
		}
	}()
	if writable {
		return s.db.Update(fn)
	}
	return s.db.View(fn)
}

// isFault reports whether a recovered panic is a memory fault (a read of
// the mapped file past its end), as debug.SetPanicOnFault makes them.
func isFault(r any) bool {
	_, ok := r.(interface{ Addr() uintptr })
	return ok
}

// faulted is the error of a transaction that faulted reading the mapped
// file: the watch looks at once, and says what happened.
func (s *Store) faulted(r any) error {
	if err := s.checkFile(); err != nil {
		return err
	}
	return fmt.Errorf("state file %s: reading it faulted (%v): %w", s.path, r, ErrFileLost)
}

// Close waits for pending commits, then closes the file. It is safe to call
// more than once.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.drainCommits()
		close(s.health.closed)
		s.health.probes.Wait()
		s.closeErr = s.db.Close()
	})
	return s.closeErr
}

// Stats are bbolt's counters for the open file (pages written, transaction
// counts, timings); the metrics and the benchmarks read them.
func (s *Store) Stats() bolt.Stats { return s.db.Stats() }
