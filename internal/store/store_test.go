package store

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/fsm"
	bolt "go.etcd.io/bbolt"
)

// TestMain doubles as a helper process: with CSID_STORE_HOLD=<path> it opens
// the store, prints "held", and keeps it open until stdin closes.
func TestMain(m *testing.M) {
	if path := os.Getenv("CSID_STORE_HOLD"); path != "" {
		s, err := Open(path, Options{})
		if err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		s.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func openTemp(t testing.TB, opts Options) (*Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "csid.db")
	s, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func digest(t *testing.T, path string) [32]byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(raw)
}

func TestOpenCreatesThenReopens(t *testing.T) {
	s, path := openTemp(t, Options{})
	if err := s.Update(func(tx *Tx) error {
		return tx.Accept(&Volume{ID: "v1", Name: "n1", State: fsm.Absent}, &Op{Event: fsm.Create})
	}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	err = s2.View(func(tx *Tx) error {
		v, err := tx.Volume("v1")
		if err != nil || v == nil || v.ActiveOp == 0 {
			return fmt.Errorf("volume after reopen: %+v, %v", v, err)
		}
		if id, err := tx.VolumeIDByName("n1"); err != nil || id != "v1" {
			return fmt.Errorf("name index lost: %q, %v", id, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRefusesUnknownSchemaWithoutTouchingIt(t *testing.T) {
	s, path := openTemp(t, Options{})
	s.Close()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keySchema, u64(99)) }); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before := digest(t, path)
	_, err = Open(path, Options{})
	if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), "schema version 99") {
		t.Fatalf("Open of schema 99: %v", err)
	}
	if _, err := OpenReadOnly(path, Options{}); !errors.Is(err, ErrSchema) {
		t.Fatalf("OpenReadOnly of schema 99: %v", err)
	}
	if digest(t, path) != before {
		t.Fatal("refusing the file modified it")
	}
}

func TestRefusesUnreadableFiles(t *testing.T) {
	dir := t.TempDir()
	cases := map[string][]byte{
		"garbage":          bytes.Repeat([]byte("not a database "), 1000),
		"truncated header": []byte{0, 1, 2},
	}
	for name, content := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
			if err := os.WriteFile(path, content, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path, Options{})
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "does not recreate") {
				t.Fatalf("Open: %v", err)
			}
			raw, _ := os.ReadFile(path)
			if !bytes.Equal(raw, content) {
				t.Fatal("the file was modified")
			}
		})
	}
	t.Run("foreign bbolt file", func(t *testing.T) {
		path := filepath.Join(dir, "foreign.db")
		db, err := bolt.Open(path, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		_ = db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("other")); return err })
		db.Close()
		before := digest(t, path)
		if _, err := Open(path, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open of a foreign bbolt file: %v", err)
		}
		if digest(t, path) != before {
			t.Fatal("the foreign file was modified")
		}
	})
}

func TestLockedFileNamesHolderQuickly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "csid.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CSID_STORE_HOLD="+path)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		t.Fatalf("helper: %q", line)
	}
	for _, open := range []func(string, Options) (*Store, error){Open, OpenReadOnly} {
		start := time.Now()
		_, err := open(path, Options{LockTimeout: 300 * time.Millisecond})
		took := time.Since(start)
		var le *LockedError
		if !errors.As(err, &le) || !errors.Is(err, ErrLocked) {
			t.Fatalf("want LockedError, got %v", err)
		}
		if !strings.Contains(le.Holder, "pid "+strconv.Itoa(cmd.Process.Pid)) {
			t.Fatalf("holder %q does not name pid %d", le.Holder, cmd.Process.Pid)
		}
		if took > 2*time.Second {
			t.Fatalf("took %v to report the lock", took)
		}
	}
}

func TestReadOnlyNeverModifies(t *testing.T) {
	s, path := openTemp(t, Options{})
	_ = s.Update(func(tx *Tx) error { return tx.Accept(&Volume{ID: "v", State: fsm.Absent}, &Op{Event: fsm.Create}) })
	s.Close()
	before := digest(t, path)
	ro, err := OpenReadOnly(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ro.Update(func(*Tx) error { return nil }); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("Update on read-only store: %v", err)
	}
	var n int
	_ = ro.View(func(tx *Tx) error { n = tx.CountVolumes(); return nil })
	ro.Close()
	if n != 1 {
		t.Fatalf("read-only view sees %d volumes", n)
	}
	if digest(t, path) != before {
		t.Fatal("read-only open modified the file")
	}
	if _, err := OpenReadOnly(filepath.Join(t.TempDir(), "missing.db"), Options{}); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only open of a missing file: %v", err)
	}
}

func TestAcceptFinishAreAtomicWithOpAndHistory(t *testing.T) {
	s, _ := openTemp(t, Options{})
	v := &Volume{ID: "v1", Name: "pvc-1", State: fsm.Absent}
	op := &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created}
	if err := s.Update(func(tx *Tx) error { vv, oo := *v, *op; err := tx.Accept(&vv, &oo); *v, *op = vv, oo; return err }); err != nil {
		t.Fatal(err)
	}
	if op.Seq == 0 || v.ActiveOp != op.Seq {
		t.Fatalf("accept: op %d, volume active %d", op.Seq, v.ActiveOp)
	}
	// Finishing with a mismatched op fails and changes nothing.
	bad := *op
	bad.Seq = op.Seq + 1
	bad.Status = OpSucceeded
	if err := s.Update(func(tx *Tx) error { vv := *v; return tx.Finish(&vv, &bad) }); err == nil {
		t.Fatal("Finish accepted an op that is not the volume's active op")
	}
	// A fn that writes and then fails leaves nothing behind.
	boom := errors.New("boom")
	err := s.Update(func(tx *Tx) error {
		vv, oo := *v, *op
		vv.State, oo.Status = fsm.Created, OpSucceeded
		if err := tx.Finish(&vv, &oo); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		got, _ := tx.Volume("v1")
		h, _ := tx.History("v1")
		active, _ := tx.ActiveOps()
		if got.State != fsm.Absent || len(h) != 0 || len(active) != 1 {
			t.Errorf("rolled-back finish leaked: state %s, history %d, active %d", got.State, len(h), len(active))
		}
		return nil
	})
	if err := s.Update(func(tx *Tx) error {
		vv, oo := *v, *op
		vv.State, oo.Status = fsm.Created, OpSucceeded
		return tx.Finish(&vv, &oo)
	}); err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		got, _ := tx.Volume("v1")
		h, _ := tx.History("v1")
		gotOp, _ := tx.Op(op.Seq)
		active, _ := tx.ActiveOps()
		if got.State != fsm.Created || got.ActiveOp != 0 || len(h) != 1 || h[0].OpSeq != op.Seq || gotOp.Status != OpSucceeded || len(active) != 0 {
			t.Errorf("after finish: %+v history %+v op %+v active %d", got, h, gotOp, len(active))
		}
		return nil
	})
}

func TestFinishToAbsentRemovesEverything(t *testing.T) {
	s, _ := openTemp(t, Options{})
	var seq uint64
	_ = s.Update(func(tx *Tx) error {
		v := &Volume{ID: "v1", Name: "n", State: fsm.Created}
		if err := tx.Reconcile(v, fsm.Rebuild, fsm.Detached, "rebuilt", time.Now()); err != nil {
			return err
		}
		if err := tx.PutResize(&Resize{VolumeID: "v1", TargetBytes: 1}); err != nil {
			return err
		}
		op := &Op{Event: fsm.Delete, From: fsm.Created, To: fsm.Absent}
		err := tx.Accept(v, op)
		seq = op.Seq
		return err
	})
	err := s.Update(func(tx *Tx) error {
		v, _ := tx.Volume("v1")
		op, _ := tx.Op(seq)
		v.State, op.Status = fsm.Absent, OpSucceeded
		return tx.Finish(v, op)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		v, _ := tx.Volume("v1")
		h, _ := tx.History("v1")
		r, _ := tx.Resize("v1")
		op, _ := tx.Op(seq)
		name, _ := tx.VolumeIDByName("n")
		if v != nil || name != "" || r != nil {
			t.Errorf("deleted volume left: %+v name=%q resize=%+v", v, name, r)
		}
		// Its notes are gone; its ops (here, the delete) stay readable until pruned.
		if len(h) != 1 || h[0].OpSeq != seq || h[0].Event != fsm.Delete {
			t.Errorf("history of the deleted volume: %+v", h)
		}
		if op == nil || op.Status != OpSucceeded {
			t.Errorf("the delete op itself must remain for inspection: %+v", op)
		}
		return nil
	})
}

func TestHistoryIsBounded(t *testing.T) {
	s, _ := openTemp(t, Options{HistoryLimit: 5})
	for i := 0; i < 12; i++ {
		i := i
		if err := s.Update(func(tx *Tx) error {
			if err := tx.AddNote("a", HistoryEntry{Generation: uint64(i)}); err != nil {
				return err
			}
			return tx.AddNote("b", HistoryEntry{Generation: uint64(100 + i)})
		}); err != nil {
			t.Fatal(err)
		}
	}
	_ = s.View(func(tx *Tx) error {
		for id, first := range map[string]uint64{"a": 7, "b": 107} {
			h, _ := tx.History(id)
			if len(h) != 5 || h[0].Generation != first || h[4].Generation != first+4 {
				t.Errorf("history of %s: %+v", id, h)
			}
		}
		return nil
	})
}

func TestOpsArePrunedBeyondRetentionExceptLastAndActive(t *testing.T) {
	s, _ := openTemp(t, Options{OpRetention: 3, NoSync: true})
	// run accepts and finishes one op on volume id; finish=false leaves it active.
	run := func(id string, finish bool) uint64 {
		var seq uint64
		err := s.Update(func(tx *Tx) error {
			v, err := tx.Volume(id)
			if err != nil {
				return err
			}
			op := &Op{Event: fsm.Expand, From: fsm.Created, To: fsm.Created}
			if v == nil {
				v = &Volume{ID: id, State: fsm.Absent}
				op = &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created}
			}
			if err := tx.Accept(v, op); err != nil {
				return err
			}
			seq = op.Seq
			if !finish {
				return nil
			}
			v.State, op.Status = fsm.Created, OpSucceeded
			return tx.Finish(v, op)
		})
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	idle := run("idle", true)        // 1: the idle volume's last op, out of the window soon
	running := run("running", false) // 2: stays active
	var a []uint64
	for i := 0; i < 8; i++ {
		a = append(a, run("a", true)) // 3..10
	}
	kept := func() []uint64 {
		var seqs []uint64
		_ = s.View(func(tx *Tx) error {
			return tx.ForEachOp(func(op *Op) bool { seqs = append(seqs, op.Seq); return true })
		})
		return seqs
	}
	// Window: the 3 newest (8, 9, 10); plus the idle volume's last op and
	// the active op, however old.
	if got := fmt.Sprint(kept()); got != fmt.Sprint([]uint64{a[7], a[6], a[5], running, idle}) {
		t.Fatalf("ops kept: %s", got)
	}
	// The idle volume's next op supersedes its old last op, which goes.
	next := run("idle", true)
	if got := fmt.Sprint(kept()); got != fmt.Sprint([]uint64{next, a[7], a[6], running}) {
		t.Fatalf("after the idle volume moved on: %s", got)
	}
	// Every volume's history still ends with its state's explanation.
	_ = s.View(func(tx *Tx) error {
		for id, want := range map[string]uint64{"idle": next, "a": a[7]} {
			h, _ := tx.History(id)
			if len(h) == 0 || h[len(h)-1].OpSeq != want {
				t.Errorf("history of %s: %+v", id, h)
			}
		}
		return nil
	})
}

func TestGroupCommitSharesTransactionsAndIsolatesFailures(t *testing.T) {
	var batches, calls atomic.Int64
	var maxBatch atomic.Int64
	s, _ := openTemp(t, Options{Observe: func(n int, _ time.Duration) {
		batches.Add(1)
		calls.Add(int64(n))
		for {
			m := maxBatch.Load()
			if int64(n) <= m || maxBatch.CompareAndSwap(m, int64(n)) {
				break
			}
		}
	}})
	const writers, each = 32, 20
	boom := errors.New("boom")
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				fail := i%7 == 3
				err := s.Update(func(tx *Tx) error {
					if err := tx.AddNote(fmt.Sprintf("w%d", w), HistoryEntry{Generation: uint64(i)}); err != nil {
						return err
					}
					if fail {
						return boom
					}
					return nil
				})
				if fail != errors.Is(err, boom) || (!fail && err != nil) {
					t.Errorf("writer %d call %d: fail=%v err=%v", w, i, fail, err)
				}
				if fail {
					failures.Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	okCalls := int64(writers*each) - failures.Load()
	if calls.Load() != okCalls {
		t.Fatalf("committed %d calls, want %d", calls.Load(), okCalls)
	}
	if maxBatch.Load() < 2 {
		t.Fatalf("32 concurrent writers never shared a commit (max batch %d)", maxBatch.Load())
	}
	_ = s.View(func(tx *Tx) error {
		for w := 0; w < writers; w++ {
			h, _ := tx.History(fmt.Sprintf("w%d", w))
			want := each - (each+3)/7 // calls with i%7==3 rolled back
			if len(h) != want {
				t.Errorf("writer %d: %d entries, want %d (a failed call's writes leaked or an ok one was lost)", w, len(h), want)
			}
		}
		return nil
	})
	t.Logf("%d calls in %d commits, largest batch %d", calls.Load(), batches.Load(), maxBatch.Load())
}

func TestOnCommitHooksRunInCommitOrderBeforeUpdateReturns(t *testing.T) {
	s, _ := openTemp(t, Options{})
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			ran := false
			err := s.Update(func(tx *Tx) error {
				if err := tx.AddNote("x", HistoryEntry{Generation: uint64(i)}); err != nil {
					return err
				}
				tx.OnCommit(func() { mu.Lock(); order = append(order, i); ran = true; mu.Unlock() })
				return nil
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || !ran {
				t.Errorf("call %d: err %v, hook ran %v", i, err, ran)
			}
		}(i)
	}
	wg.Wait()
	var hist []HistoryEntry
	_ = s.View(func(tx *Tx) error { hist, _ = tx.History("x"); return nil })
	if len(hist) != 50 || len(order) != 50 {
		t.Fatalf("%d entries, %d hooks", len(hist), len(order))
	}
	for i := range hist {
		if int(hist[i].Generation) != order[i] {
			t.Fatalf("hook order %v differs from commit order at %d", order, i)
		}
	}
}

func TestUpdateAfterCloseFails(t *testing.T) {
	s, _ := openTemp(t, Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
		t.Fatalf("Update after Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestVolumeReadsAreTheCallersOwn: Volume returns a record from the decode
// cache, but one the caller owns; changing it changes neither the cache nor
// the next read, and a record written anew is read as written.
func TestVolumeReadsAreTheCallersOwn(t *testing.T) {
	s, _ := openTemp(t, Options{NoSync: true})
	v := &Volume{ID: "v1", State: fsm.Absent, Parameters: map[string]string{"k": "v"},
		Capability: Capability{AccessType: "mount", MountFlags: []string{"noatime"}},
		Attachment: &Attachment{Node: "n1", PublishContext: map[string]string{"p": "c"}},
		Stage:      &Stage{Path: "/s"}, Targets: map[string]Target{"/t": {}}}
	op := &Op{Event: fsm.Create, From: fsm.Absent, To: fsm.Created}
	if err := s.Update(func(tx *Tx) error { vv := *v; return tx.Accept(&vv, op) }); err != nil {
		t.Fatal(err)
	}
	read := func() *Volume {
		var got *Volume
		if err := s.View(func(tx *Tx) error { var err error; got, err = tx.Volume("v1"); return err }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	first := read()
	first.Parameters["k"] = "changed"
	first.Capability.MountFlags[0] = "changed"
	first.Attachment.PublishContext["p"] = "changed"
	first.Stage.Path = "changed"
	first.Targets["/other"] = Target{}
	again := read()
	if again.Parameters["k"] != "v" || again.Capability.MountFlags[0] != "noatime" || again.Attachment.PublishContext["p"] != "c" ||
		again.Stage.Path != "/s" || len(again.Targets) != 1 {
		t.Fatalf("a change to a read record leaked into the next read: %+v", again)
	}
	// Finishing the op rewrites the record; the next read sees the new one.
	if err := s.Update(func(tx *Tx) error {
		cur, err := tx.Volume("v1")
		if err != nil {
			return err
		}
		o, err := tx.Op(op.Seq)
		if err != nil {
			return err
		}
		cur.State, cur.Generation, o.Status = fsm.Created, 1, OpSucceeded
		return tx.Finish(cur, o)
	}); err != nil {
		t.Fatal(err)
	}
	if got := read(); got.State != fsm.Created || got.Generation != 1 || got.ActiveOp != 0 {
		t.Fatalf("after the finish: %+v", got)
	}
}

// TestStateWritesMustBeStepsOfTheTable: every path that writes a volume's
// state is held to the lifecycle table; a bypass, or a change recorded
// under another event's name, is refused and changes nothing.
func TestStateWritesMustBeStepsOfTheTable(t *testing.T) {
	s, _ := openTemp(t, Options{NoSync: true})
	now := time.Now()
	published := &Volume{ID: "v1", State: fsm.Published, Targets: map[string]Target{"/t": {}}, Stage: &Stage{Path: "/s"}}
	err := s.Update(func(tx *Tx) error {
		return tx.Reconcile(published.Clone(), fsm.Adopt, fsm.HasTargets, "found mounted", now)
	})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]func(tx *Tx) error{
		"a new record that is not a create": func(tx *Tx) error {
			return tx.Accept(&Volume{ID: "v2", State: fsm.Created}, &Op{Event: fsm.Expand, From: fsm.Created, To: fsm.Created})
		},
		"a rollback labelled as the event that did not happen": func(tx *Tx) error {
			v := published.Clone()
			v.State, v.Stage, v.Targets = fsm.NodeReady, nil, nil
			return tx.Reconcile(v, fsm.NodePublish, fsm.NoGuard, "no longer mounted", now)
		},
		"a rollback recorded under the op's event whose step it is": func(tx *Tx) error {
			// PUBLISHED -> VOL_READY is node_unpublish [last target]'s
			// step, but no node_unpublish ran: the target vanished.
			v := published.Clone()
			v.State, v.Targets = fsm.VolReady, nil
			return tx.Reconcile(v, fsm.NodeUnpublish, fsm.LastTarget, "no longer mounted", now)
		},
		"a rollback with the wrong guard": func(tx *Tx) error {
			v := published.Clone()
			v.State, v.Stage, v.Targets = fsm.NodeReady, nil, nil
			return tx.Reconcile(v, fsm.Rollback, fsm.Unpublished, "no longer mounted", now)
		},
		"a forget of a staged volume": func(tx *Tx) error {
			v := published.Clone()
			v.State = fsm.Absent
			return tx.Reconcile(v, fsm.Forget, fsm.NoGuard, "gone", now)
		},
		"an op whose step the table does not take": func(tx *Tx) error {
			v, _ := tx.Volume("v1")
			op := &Op{Event: fsm.NodeUnstage, From: fsm.VolReady, To: fsm.NodeReady}
			if err := tx.Accept(v, op); err != nil {
				return err
			}
			op.From, op.Status = fsm.Published, OpSucceeded
			v.State = fsm.NodeReady
			return tx.Finish(v, op)
		},
		"an op finishing from another state than the stored one": func(tx *Tx) error {
			v, _ := tx.Volume("v1")
			op := &Op{Event: fsm.Delete, From: fsm.Created, To: fsm.Absent}
			if err := tx.Accept(v, op); err != nil {
				return err
			}
			op.Status, v.State = OpSucceeded, fsm.Absent // a legal step, but v1 is PUBLISHED
			return tx.Finish(v, op)
		},
		"an op finishing in another state than its step's": func(tx *Tx) error {
			v, _ := tx.Volume("v1")
			op := &Op{Event: fsm.NodeUnpublish, Guard: fsm.OtherTargets, From: fsm.Published, To: fsm.Published}
			if err := tx.Accept(v, op); err != nil {
				return err
			}
			op.Status, v.State = OpSucceeded, fsm.VolReady
			return tx.Finish(v, op)
		},
	}
	for name, write := range refused {
		if err := s.Update(write); !errors.Is(err, fsm.ErrIllegal) {
			t.Errorf("%s: %v, want a refusal wrapping fsm.ErrIllegal", name, err)
		}
	}
	err = s.View(func(tx *Tx) error {
		v, err := tx.Volume("v1")
		if err != nil || v == nil || v.State != fsm.Published || v.ActiveOp != 0 {
			return fmt.Errorf("after the refusals: %+v, %v", v, err)
		}
		if v2, _ := tx.Volume("v2"); v2 != nil {
			return fmt.Errorf("a refused accept wrote %+v", v2)
		}
		h, err := tx.History("v1")
		if err != nil {
			return err
		}
		if len(h) != 1 || h[0].Event != fsm.Adopt || h[0].Guard != fsm.HasTargets || h[0].From != fsm.Absent || h[0].To != fsm.Published {
			return fmt.Errorf("history: %+v, want the one adopt line", h)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The legal rollback is recorded under its own name.
	err = s.Update(func(tx *Tx) error {
		v := published.Clone()
		v.State, v.Targets = fsm.VolReady, nil
		return tx.Reconcile(v, fsm.Rollback, fsm.Unpublished, "no longer mounted: /t", now)
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = s.View(func(tx *Tx) error {
		h, _ := tx.History("v1")
		if last := h[len(h)-1]; last.Event != fsm.Rollback || last.From != fsm.Published || last.To != fsm.VolReady || last.Generation != 2 {
			t.Errorf("rollback line: %+v", last)
		}
		return nil
	})
}
