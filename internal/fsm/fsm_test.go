package fsm

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestEveryStateEventPair walks the full state x event x guard matrix. The
// expected column is written out by hand, independently of the table, so a
// change to the table that is not also made here fails.
func TestEveryStateEventPair(t *testing.T) {
	const illegal State = "-"
	type guarded struct {
		g    Guard
		want State
	}
	// For each event: the guards it is asked with, and for each state the
	// expected destination per guard (illegal where rejected).
	expect := map[Event]map[State][]guarded{
		Create: {
			Absent: {{NoGuard, Created}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
		Delete: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, Absent}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
		ControllerPublish: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, NodeReady}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
		ControllerUnpublish: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, Created}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
		NodeStage: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, VolReady}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
		NodeUnstage: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, NodeReady}}, Published: {{NoGuard, illegal}},
		},
		NodePublish: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, Published}}, Published: {{NoGuard, Published}},
		},
		NodeUnpublish: {
			Absent:    {{LastTarget, illegal}, {OtherTargets, illegal}, {NoGuard, illegal}},
			Created:   {{LastTarget, illegal}, {OtherTargets, illegal}, {NoGuard, illegal}},
			NodeReady: {{LastTarget, illegal}, {OtherTargets, illegal}, {NoGuard, illegal}},
			VolReady:  {{LastTarget, illegal}, {OtherTargets, illegal}, {NoGuard, illegal}},
			Published: {{LastTarget, VolReady}, {OtherTargets, Published}, {NoGuard, illegal}},
		},
		Expand: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, Created}}, NodeReady: {{NoGuard, NodeReady}},
			VolReady: {{NoGuard, VolReady}}, Published: {{NoGuard, Published}},
		},
		NodeExpand: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, illegal}},
			VolReady: {{NoGuard, VolReady}}, Published: {{NoGuard, Published}},
		},
		Adopt: {
			Absent:    {{NoGuard, NodeReady}, {Staged, VolReady}, {HasTargets, Published}, {Attached, illegal}},
			Created:   {{NoGuard, illegal}, {Staged, illegal}, {HasTargets, illegal}, {Attached, NodeReady}},
			NodeReady: {{NoGuard, illegal}, {Staged, VolReady}, {HasTargets, Published}, {Attached, illegal}},
			VolReady:  {{NoGuard, illegal}, {Staged, illegal}, {HasTargets, Published}, {Attached, illegal}},
			Published: {{NoGuard, illegal}, {Staged, illegal}, {HasTargets, Published}, {Attached, illegal}},
		},
		Rebuild: {
			Absent:    {{Detached, Created}, {Attached, NodeReady}, {NoGuard, illegal}},
			Created:   {{Detached, illegal}, {Attached, illegal}, {NoGuard, illegal}},
			NodeReady: {{Detached, illegal}, {Attached, illegal}, {NoGuard, illegal}},
			VolReady:  {{Detached, illegal}, {Attached, illegal}, {NoGuard, illegal}},
			Published: {{Detached, illegal}, {Attached, illegal}, {NoGuard, illegal}},
		},
		Rollback: {
			Absent:    {{Unstaged, illegal}, {Unpublished, illegal}, {OtherTargets, illegal}, {Detached, illegal}, {NoGuard, illegal}},
			Created:   {{Unstaged, illegal}, {Unpublished, illegal}, {OtherTargets, illegal}, {Detached, illegal}, {NoGuard, illegal}},
			NodeReady: {{Unstaged, illegal}, {Unpublished, illegal}, {OtherTargets, illegal}, {Detached, Created}, {NoGuard, illegal}},
			VolReady:  {{Unstaged, NodeReady}, {Unpublished, illegal}, {OtherTargets, illegal}, {Detached, illegal}, {NoGuard, illegal}},
			Published: {{Unstaged, NodeReady}, {Unpublished, VolReady}, {OtherTargets, Published}, {Detached, illegal}, {NoGuard, illegal}},
		},
		Forget: {
			Absent: {{NoGuard, illegal}}, Created: {{NoGuard, illegal}}, NodeReady: {{NoGuard, Absent}},
			VolReady: {{NoGuard, illegal}}, Published: {{NoGuard, illegal}},
		},
	}
	deferredIn := map[State]bool{NodeReady: true, VolReady: true, Published: true}

	if len(expect) != len(Events) {
		t.Fatalf("expectation covers %d events, the package declares %d", len(expect), len(Events))
	}
	pairs := 0
	for _, e := range Events {
		for _, s := range States {
			cases, ok := expect[e][s]
			if !ok {
				t.Fatalf("no expectation for %s in %s", e, s)
			}
			for _, c := range cases {
				pairs++
				step, err := Next(s, e, c.g)
				if c.want == illegal {
					if !errors.Is(err, ErrIllegal) {
						t.Errorf("%s [%s] in %s: want ErrIllegal, got step %+v err %v", e, c.g, s, step, err)
					}
					continue
				}
				if err != nil {
					t.Errorf("%s [%s] in %s: want %s, got %v", e, c.g, s, c.want, err)
					continue
				}
				if step.To != c.want || step.From != s || step.Event != e {
					t.Errorf("%s [%s] in %s: got %+v, want to=%s", e, c.g, s, step, c.want)
				}
				if e == Expand && step.Deferred() != deferredIn[s] {
					t.Errorf("expand in %s: deferred=%v, want %v", s, step.Deferred(), deferredIn[s])
				}
			}
		}
	}
	if want := len(Events) * len(States); pairs < want {
		t.Fatalf("walked %d pairs, want at least %d", pairs, want)
	}
}

func TestLegalMatchesNext(t *testing.T) {
	for _, s := range States {
		for _, e := range Events {
			any := false
			for _, g := range []Guard{NoGuard, LastTarget, OtherTargets, Deferred, Staged, HasTargets, Detached, Attached, Unstaged, Unpublished} {
				if _, err := Next(s, e, g); err == nil {
					any = true
				}
			}
			if Legal(s, e) != any {
				t.Errorf("Legal(%s, %s)=%v but Next says %v", s, e, Legal(s, e), any)
			}
		}
	}
}

func TestInverses(t *testing.T) {
	pairs := map[Event]Event{Create: Delete, ControllerPublish: ControllerUnpublish, NodeStage: NodeUnstage, NodePublish: NodeUnpublish}
	for f, inv := range pairs {
		if got, ok := Inverse(f); !ok || got != inv {
			t.Errorf("Inverse(%s) = %s, %v; want %s", f, got, ok, inv)
		}
		if got, ok := Forward(inv); !ok || got != f {
			t.Errorf("Forward(%s) = %s, %v; want %s", inv, got, ok, f)
		}
	}
	for _, e := range []Event{Expand, NodeExpand, Adopt, Rebuild, Rollback, Forget} {
		if _, ok := Inverse(e); ok {
			t.Errorf("%s must have no inverse", e)
		}
	}
	// Every inverse really leads back: forward then inverse returns to the start.
	for f, inv := range pairs {
		for _, tr := range Transitions() {
			if tr.Event != f || tr.From == tr.To {
				continue
			}
			back := LastTarget
			if inv != NodeUnpublish {
				back = NoGuard
			}
			step, err := Next(tr.To, inv, back)
			if err != nil || step.To != tr.From {
				t.Errorf("%s from %s leads to %s, but %s from there gives %+v, %v", f, tr.From, tr.To, inv, step, err)
			}
		}
	}
}

func TestValidateRejectsDuplicateRows(t *testing.T) {
	if err := validate(volumeTable, States, Events); err != nil {
		t.Fatal(err)
	}
	rows := append([]row{}, volumeTable...)
	rows = append(rows, row{Create, NoGuard, []State{Absent}, Created})
	if err := validate(rows, States, Events); err == nil {
		t.Fatal("a table with a duplicate row passed")
	}
	if err := validate(snapshotTable, SnapshotStates, SnapshotEvents); err != nil {
		t.Fatal(err)
	}
	// A row of one lifecycle in the other's table names a state or an
	// event the other does not have.
	if err := validate(append(slices.Clone(snapshotTable), volumeTable[0]), SnapshotStates, SnapshotEvents); err == nil {
		t.Fatal("a snapshot table with a volume row passed")
	}
	if err := validate(append(slices.Clone(volumeTable), snapshotTable[0]), States, Events); err == nil {
		t.Fatal("a volume table with a snapshot row passed")
	}
}

// TestSnapshotEveryStateEventPair walks the snapshot lifecycle's full
// state x event matrix, written out by hand, independently of the table.
func TestSnapshotEveryStateEventPair(t *testing.T) {
	const illegal State = "-"
	expect := map[Event]map[State]State{
		SnapshotCreate: {Absent: Ready, Ready: illegal},
		SnapshotDelete: {Absent: illegal, Ready: Absent},
		Rebuild:        {Absent: Ready, Ready: illegal},
		Forget:         {Absent: illegal, Ready: Absent},
	}
	if len(expect) != len(SnapshotEvents) {
		t.Fatalf("expectation covers %d events, the snapshot lifecycle declares %d", len(expect), len(SnapshotEvents))
	}
	for _, e := range SnapshotEvents {
		for _, s := range SnapshotStates {
			want, ok := expect[e][s]
			if !ok {
				t.Fatalf("no expectation for %s in %s", e, s)
			}
			// Guards of the volume lifecycle mean nothing here.
			for _, g := range []Guard{Detached, Attached, LastTarget} {
				if _, err := Snapshots.Next(s, e, g); !errors.Is(err, ErrIllegal) {
					t.Errorf("snapshot %s [%s] in %s: want ErrIllegal, got %v", e, g, s, err)
				}
			}
			step, err := Snapshots.Next(s, e, NoGuard)
			if want == illegal {
				if !errors.Is(err, ErrIllegal) || Snapshots.Legal(s, e) {
					t.Errorf("snapshot %s in %s: want ErrIllegal, got %+v, %v", e, s, step, err)
				}
				continue
			}
			if err != nil || step.To != want || !Snapshots.Legal(s, e) {
				t.Errorf("snapshot %s in %s: got %+v, %v; want to=%s", e, s, step, err, want)
			}
		}
	}
	// The lifecycles are apart: no snapshot event moves a volume, no
	// volume op event moves a snapshot, and READY is no volume state.
	for _, s := range States {
		for _, e := range SnapshotOpEvents {
			if Legal(s, e) {
				t.Errorf("volume lifecycle takes snapshot event %s in %s", e, s)
			}
		}
	}
	for _, s := range SnapshotStates {
		for _, e := range OpEvents {
			if Snapshots.Legal(s, e) {
				t.Errorf("snapshot lifecycle takes volume event %s in %s", e, s)
			}
		}
	}
	if _, err := Next(Ready, Forget, NoGuard); !errors.Is(err, ErrIllegal) {
		t.Errorf("volume forget from READY: want ErrIllegal, got %v", err)
	}
	if err := Snapshots.Check(Ready, SnapshotDelete, NoGuard, Ready); !errors.Is(err, ErrIllegal) {
		t.Errorf("a snapshot_delete that leaves the record READY passed Check: %v", err)
	}
	if inv, ok := Inverse(SnapshotCreate); !ok || inv != SnapshotDelete {
		t.Errorf("Inverse(snapshot_create) = %s, %v", inv, ok)
	}
	if f, ok := Forward(SnapshotDelete); !ok || f != SnapshotCreate {
		t.Errorf("Forward(snapshot_delete) = %s, %v", f, ok)
	}
	if !SnapshotCreate.OfSnapshot() || Create.OfSnapshot() || Forget.OfSnapshot() {
		t.Error("OfSnapshot is wrong")
	}
}

// TestCheck holds the store's guard: a state write is legal only as a step
// of the table, with its guard and its destination.
func TestCheck(t *testing.T) {
	for _, c := range []struct {
		from State
		e    Event
		g    Guard
		to   State
		ok   bool
	}{
		{Published, NodeUnpublish, LastTarget, VolReady, true},
		{Published, NodeUnpublish, LastTarget, Published, false}, // wrong destination
		{Published, NodeUnpublish, NoGuard, VolReady, false},     // guard missing
		{Published, NodePublish, NoGuard, NodeReady, false},      // a bypass labelled with another event
		{Published, Rollback, Unstaged, NodeReady, true},
		{Absent, Rebuild, Attached, NodeReady, true},
		{NodeReady, Forget, NoGuard, Absent, true},
		{VolReady, Forget, NoGuard, Absent, false},
		{Created, Expand, NoGuard, Created, true},
		{NodeReady, Expand, Deferred, NodeReady, true},
	} {
		err := Check(c.from, c.e, c.g, c.to)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrIllegal)) {
			t.Errorf("Check(%s, %s [%s], %s) = %v, want ok=%v", c.from, c.e, c.g, c.to, err, c.ok)
		}
	}
}

func TestValid(t *testing.T) {
	if !Published.Valid() || !Ready.Valid() || State("BOGUS").Valid() {
		t.Error("State.Valid is wrong")
	}
	if !NodeExpand.Valid() || !SnapshotDelete.Valid() || Event("bogus").Valid() {
		t.Error("Event.Valid is wrong")
	}
}

// TestDiagramMatchesDocs fails when docs/state-machine.md no longer holds the
// diagrams the code draws: its first mermaid block is the volume
// lifecycle, its second the snapshot lifecycle. Regenerate with: go test
// ./internal/fsm -run Diagram -update
func TestDiagramMatchesDocs(t *testing.T) {
	path := filepath.Join("..", "..", "docs", "state-machine.md")
	doc, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "```mermaid\n", "```\n"
	text := string(doc)
	from, drifted := 0, false
	for _, l := range []*Lifecycle{Volumes, Snapshots} {
		i := strings.Index(text[from:], begin)
		if i < 0 {
			t.Fatalf("%s has no mermaid block for the %s lifecycle", path, l.Name())
		}
		i += from + len(begin)
		j := strings.Index(text[i:], end)
		if j < 0 {
			t.Fatalf("%s: unterminated mermaid block", path)
		}
		got, want := text[i:i+j], l.Mermaid()
		if got != want {
			if !*update {
				t.Errorf("%s drifted from the code's %s lifecycle; run `go test ./internal/fsm -run Diagram -update`.\nwant:\n%s\ngot:\n%s",
					path, l.Name(), want, got)
			}
			text, drifted = text[:i]+want+text[i+j:], true
		}
		from = i + len(want) + len(end)
	}
	if drifted && *update {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("updated %s", path)
	}
}
