// Package fsm is the lifecycles of csid, the volume's and the snapshot's:
// their states, their events and the legal transitions between them, each
// as one declarative table (Volumes, Snapshots).
//
// A table is executed by github.com/looplab/fsm: Next puts a looplab
// machine in the record's state and fires the event's Event call, and
// looplab decides whether it is legal and where it leads. The package does
// no I/O and has no callbacks with effects: it answers "what does event E
// do to a volume (or a snapshot) in state S" and nothing else. Every change
// of a stored state in csid goes through Next (internal/store refuses a
// state write without a legal step), CSI calls and reconciliation alike.
// The package-level functions (Next, Check, Legal, ...) are the volume
// lifecycle's.
package fsm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"

	looplab "github.com/looplab/fsm"
)

// State is a lifecycle state of a volume.
type State string

// The lifecycle states. Absent is the pseudo-state of a volume that has no
// record (before CreateVolume has completed, and after DeleteVolume).
const (
	Absent    State = "ABSENT"
	Created   State = "CREATED"
	NodeReady State = "NODE_READY"
	VolReady  State = "VOL_READY"
	Published State = "PUBLISHED"
)

// Ready is the state of a snapshot that is cut and can be restored from.
// Its other state is Absent: no record (before CreateSnapshot completes,
// after DeleteSnapshot).
const Ready State = "READY"

// States lists every state of a volume, Absent first, in lifecycle order.
var States = []State{Absent, Created, NodeReady, VolReady, Published}

// SnapshotStates lists every state of a snapshot, Absent first.
var SnapshotStates = []State{Absent, Ready}

// Event is something that happens to a volume: one CSI call's intent.
type Event string

// The lifecycle events. The first ten are CSI calls' intents; NodeExpand
// (NodeExpandVolume) is csid's addition to the CSI diagram: it grows a
// staged filesystem and never changes the state. The last four are what
// csid finds rather than what it is asked: they make no effect, they record
// a state that reality already has.
const (
	Create              Event = "create"
	ControllerPublish   Event = "controller_publish"
	NodeStage           Event = "node_stage"
	NodePublish         Event = "node_publish"
	NodeUnpublish       Event = "node_unpublish"
	NodeUnstage         Event = "node_unstage"
	ControllerUnpublish Event = "controller_unpublish"
	Delete              Event = "delete"
	Expand              Event = "expand"
	NodeExpand          Event = "node_expand"
	// Adopt: csid takes on what the world has and its record lacks: a
	// node, a volume attached to it (at its first NodeStageVolume) or found
	// staged or published on the host at start (the node's state file was
	// lost); a controller, an attachment the cloud has and the record does
	// not.
	Adopt Event = "adopt"
	// Rebuild: a controller rebuilds a record from the disk's tags in the
	// cloud (an explicit rebuild of a lost state file).
	Rebuild Event = "rebuild"
	// Rollback: a record is brought back to what the host or the cloud
	// has: a mount that vanished (a reboot, an unmount by hand), a disk the
	// cloud no longer has attached.
	Rollback Event = "rollback"
	// Forget: a node drops the record of a volume that has nothing left on
	// it (no staging, no target); a controller drops the record of a
	// snapshot the provider no longer has.
	Forget Event = "forget"
)

// The snapshot lifecycle's events that are asked for (CSI calls). A
// snapshot also knows Rebuild (a record rebuilt from the provider's
// snapshot and its tags) and Forget (the provider no longer has it).
const (
	SnapshotCreate Event = "snapshot_create"
	SnapshotDelete Event = "snapshot_delete"
)

// Events lists every event of a volume in lifecycle order.
var Events = append(slices.Clone(OpEvents), Adopt, Rebuild, Rollback, Forget)

// OpEvents lists the events of a volume that are asked for (CSI calls),
// which the operation engine runs as ops; the others record what csid
// finds.
var OpEvents = []Event{Create, ControllerPublish, NodeStage, NodePublish, NodeUnpublish,
	NodeUnstage, ControllerUnpublish, Delete, Expand, NodeExpand}

// SnapshotEvents lists every event of a snapshot.
var SnapshotEvents = append(slices.Clone(SnapshotOpEvents), Rebuild, Forget)

// SnapshotOpEvents lists the events of a snapshot that the operation
// engine runs as ops.
var SnapshotOpEvents = []Event{SnapshotCreate, SnapshotDelete}

// AllOpEvents lists every event the operation engine runs as an op: the
// volume's, then the snapshot's.
func AllOpEvents() []Event { return append(slices.Clone(OpEvents), SnapshotOpEvents...) }

// Valid reports whether s is a state of a lifecycle (a volume's or a
// snapshot's).
func (s State) Valid() bool { return slices.Contains(States, s) || slices.Contains(SnapshotStates, s) }

// Valid reports whether e is an event of a lifecycle.
func (e Event) Valid() bool { return slices.Contains(Events, e) || slices.Contains(SnapshotEvents, e) }

// OfSnapshot reports whether e is an op event of the snapshot lifecycle
// (its ops' records are snapshots, not volumes).
func (e Event) OfSnapshot() bool { return slices.Contains(SnapshotOpEvents, e) }

// Guard distinguishes the rows of one event from one state. A guard is a
// fact about the request that the caller knows (the table cannot see it).
type Guard string

// The guards of the table.
const (
	// NoGuard: the event has one row per source state.
	NoGuard Guard = ""
	// LastTarget: node_unpublish of the volume's only published target.
	LastTarget Guard = "last target"
	// OtherTargets: node_unpublish while other targets stay published.
	OtherTargets Guard = "other targets"
	// Deferred: expand of an attached volume; the resize waits in the
	// resize queue until the volume is back in CREATED.
	Deferred Guard = "deferred"
	// Staged, HasTargets: adopt of a volume found staged (no target) or
	// published on the host.
	Staged     Guard = "staged"
	HasTargets Guard = "published"
	// Detached, Attached: rebuild of a disk the cloud has detached or
	// attached; rollback of a record whose disk the cloud has detached;
	// adopt of an attachment the cloud has.
	Detached Guard = "detached"
	Attached Guard = "attached"
	// Unstaged, Unpublished: rollback of a record whose staging mount
	// (and so every target) vanished, or whose last target did.
	Unstaged    Guard = "unstaged"
	Unpublished Guard = "unpublished"
)

// row is one line of a transition table.
type row struct {
	event Event
	guard Guard
	src   []State
	dst   State // "" means "stay in the source state"
}

// volumeTable is the volume lifecycle: the one place that says which event
// is legal in which state and where it leads.
var volumeTable = []row{
	{Create, NoGuard, []State{Absent}, Created},
	{Delete, NoGuard, []State{Created}, Absent},
	{ControllerPublish, NoGuard, []State{Created}, NodeReady},
	{ControllerUnpublish, NoGuard, []State{NodeReady}, Created},
	{NodeStage, NoGuard, []State{NodeReady}, VolReady},
	{NodeUnstage, NoGuard, []State{VolReady}, NodeReady},
	{NodePublish, NoGuard, []State{VolReady, Published}, Published},
	{NodeUnpublish, LastTarget, []State{Published}, VolReady},
	{NodeUnpublish, OtherTargets, []State{Published}, Published},
	{Expand, NoGuard, []State{Created}, Created},
	{Expand, Deferred, []State{NodeReady, VolReady, Published}, ""},
	{NodeExpand, NoGuard, []State{VolReady, Published}, ""},
	{Adopt, NoGuard, []State{Absent}, NodeReady},
	{Adopt, Staged, []State{Absent, NodeReady}, VolReady},
	{Adopt, HasTargets, []State{Absent, NodeReady, VolReady, Published}, Published},
	{Adopt, Attached, []State{Created}, NodeReady},
	{Rebuild, Detached, []State{Absent}, Created},
	{Rebuild, Attached, []State{Absent}, NodeReady},
	{Rollback, Unstaged, []State{VolReady, Published}, NodeReady},
	{Rollback, Unpublished, []State{Published}, VolReady},
	{Rollback, OtherTargets, []State{Published}, Published},
	{Rollback, Detached, []State{NodeReady}, Created},
	{Forget, NoGuard, []State{NodeReady}, Absent},
}

// snapshotTable is the snapshot lifecycle. A snapshot is Absent until its
// snapshot_create op has cut it at the provider, and Ready from then until
// its snapshot_delete op (or a forget: the provider no longer has it).
// It is independent of its source volume once cut: deleting the volume
// leaves it Ready.
var snapshotTable = []row{
	{SnapshotCreate, NoGuard, []State{Absent}, Ready},
	{SnapshotDelete, NoGuard, []State{Ready}, Absent},
	{Rebuild, NoGuard, []State{Absent}, Ready},
	{Forget, NoGuard, []State{Ready}, Absent},
}

// The lifecycles. A failed forward op is compensated by its inverse's
// effect, and an inverse other than delete that arrives while its forward
// event is in flight cancels it (internal/ops decides which).
var (
	Volumes = mustLifecycle("volume", States, Events, volumeTable, map[Event]Event{
		Create:            Delete,
		ControllerPublish: ControllerUnpublish,
		NodeStage:         NodeUnstage,
		NodePublish:       NodeUnpublish,
	}, map[Event]Guard{Expand: Deferred})
	Snapshots = mustLifecycle("snapshot", SnapshotStates, SnapshotEvents, snapshotTable,
		map[Event]Event{SnapshotCreate: SnapshotDelete}, nil)
)

// Lifecycle is one declarative transition table, executed by looplab.
type Lifecycle struct {
	name     string
	states   []State
	events   []Event
	rows     []row
	inverses map[Event]Event
	// implied: an event asked without a guard falls back to this guard's
	// row when it has no unguarded one from the state (expand of an
	// attached volume is expand [deferred]).
	implied map[Event]Guard
	// descs is the table in looplab's terms: one event description per
	// row and source state, named by label.
	descs looplab.Events
	// machines holds looplab machines over the table. A looplab FSM has
	// one current state, so each decision takes a machine of its own, puts
	// it in the record's state and fires the event.
	machines sync.Pool
}

// mustLifecycle builds a lifecycle, or panics: the tables are constants,
// and a broken one must not build.
func mustLifecycle(name string, states []State, events []Event, rows []row, inverses map[Event]Event, implied map[Event]Guard) *Lifecycle {
	if err := validate(rows, states, events); err != nil {
		panic(err)
	}
	l := &Lifecycle{name: name, states: states, events: events, rows: rows, inverses: inverses, implied: implied}
	for _, r := range rows {
		for _, s := range r.src {
			dst := r.dst
			if dst == "" {
				dst = s
			}
			l.descs = append(l.descs, looplab.EventDesc{Name: label(r.event, r.guard), Src: []string{string(s)}, Dst: string(dst)})
		}
	}
	l.machines.New = func() any { return looplab.NewFSM(string(Absent), l.descs, nil) }
	return l
}

// validate checks that every row names states and events of its lifecycle
// and that no (event, guard, state) is declared twice: looplab would
// silently keep the last of two.
func validate(rows []row, states []State, events []Event) error {
	type key struct {
		e Event
		g Guard
		s State
	}
	seen := map[key]bool{}
	for _, r := range rows {
		if !slices.Contains(events, r.event) || (r.dst != "" && !slices.Contains(states, r.dst)) {
			return fmt.Errorf("fsm: row %q names an unknown event or state", label(r.event, r.guard))
		}
		for _, s := range r.src {
			k := key{r.event, r.guard, s}
			if !slices.Contains(states, s) || seen[k] {
				return fmt.Errorf("fsm: row %q from %s is unknown or declared twice", label(r.event, r.guard), s)
			}
			seen[k] = true
		}
	}
	return nil
}

// label is the name of a row inside looplab: the event, and its guard if any.
func label(e Event, g Guard) string {
	if g == NoGuard {
		return string(e)
	}
	return fmt.Sprintf("%s [%s]", e, g)
}

// Name is the lifecycle's name ("volume", "snapshot").
func (l *Lifecycle) Name() string { return l.name }

// States lists the lifecycle's states, Absent first.
func (l *Lifecycle) States() []State { return slices.Clone(l.states) }

// Events lists the lifecycle's events.
func (l *Lifecycle) Events() []Event { return slices.Clone(l.events) }

// fire asks looplab where event e under guard g leads from state s.
func (l *Lifecycle) fire(s State, e Event, g Guard) (State, bool) {
	m := l.machines.Get().(*looplab.FSM)
	defer l.machines.Put(m)
	m.SetState(string(s))
	err := m.Event(context.Background(), label(e, g))
	var same looplab.NoTransitionError
	if err != nil && !errors.As(err, &same) {
		return "", false
	}
	return State(m.Current()), true
}

// Next returns the step that event e with guard g takes from state s, as
// looplab executes the table, or an error wrapping ErrIllegal. For an
// event with an implied guard (a volume's expand), pass NoGuard: Next
// answers with the implied row where there is no other (expand [deferred]
// of an attached volume).
func (l *Lifecycle) Next(s State, e Event, g Guard) (Step, error) {
	if to, ok := l.fire(s, e, g); ok {
		return Step{Event: e, Guard: g, From: s, To: to}, nil
	}
	if ig, ok := l.implied[e]; ok && g == NoGuard {
		if to, ok := l.fire(s, e, ig); ok {
			return Step{Event: e, Guard: ig, From: s, To: to}, nil
		}
	}
	return Step{}, fmt.Errorf("%w: %s %s in state %s", ErrIllegal, l.name, label(e, g), s)
}

// Check returns nil when event e under guard g takes a record from state
// from to state to, and an error wrapping ErrIllegal otherwise. The store
// calls it for every state it writes.
func (l *Lifecycle) Check(from State, e Event, g Guard, to State) error {
	step, err := l.Next(from, e, g)
	if err != nil {
		return err
	}
	if step.To != to || step.Guard != g {
		return fmt.Errorf("%w: %s %s leads from %s to %s, not to %s", ErrIllegal, l.name, label(e, g), from, step.To, to)
	}
	return nil
}

// Legal reports whether e (under any guard) is legal in state s.
func (l *Lifecycle) Legal(s State, e Event) bool {
	m := l.machines.Get().(*looplab.FSM)
	defer l.machines.Put(m)
	m.SetState(string(s))
	for _, r := range l.rows {
		if r.event == e && m.Can(label(e, r.guard)) {
			return true
		}
	}
	return false
}

// Inverse returns the event that undoes e, if e has one.
func (l *Lifecycle) Inverse(e Event) (Event, bool) {
	inv, ok := l.inverses[e]
	return inv, ok
}

// Forward returns the event that e undoes, if e is an inverse.
func (l *Lifecycle) Forward(e Event) (Event, bool) {
	for f, inv := range l.inverses {
		if inv == e {
			return f, true
		}
	}
	return "", false
}

// Transitions lists every legal (state, event, guard) of the table with
// where looplab takes it, sorted by state order then event order.
func (l *Lifecycle) Transitions() []Transition {
	var out []Transition
	for _, r := range l.rows {
		for _, s := range r.src {
			if to, ok := l.fire(s, r.event, r.guard); ok {
				out = append(out, Transition{From: s, Event: r.event, Guard: r.guard, To: to})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if x, y := slices.Index(l.states, a.From), slices.Index(l.states, b.From); x != y {
			return x < y
		}
		if x, y := slices.Index(l.events, a.Event), slices.Index(l.events, b.Event); x != y {
			return x < y
		}
		return a.Guard < b.Guard
	})
	return out
}

// Mermaid draws the lifecycle as a Mermaid state diagram, with looplab's
// visualizer. docs/state-machine.md holds the drawings; a test keeps them
// equal.
func (l *Lifecycle) Mermaid() string {
	out, err := looplab.VisualizeWithType(looplab.NewFSM(string(Absent), l.descs, nil), looplab.MermaidStateDiagram)
	if err != nil {
		panic(err) // MermaidStateDiagram is a known type
	}
	return out
}

// Step is the outcome of applying an event to a state.
type Step struct {
	Event Event
	Guard Guard
	From  State
	To    State
}

// Deferred reports whether the event is legal but postponed (expand of an
// attached volume).
func (s Step) Deferred() bool { return s.Guard == Deferred }

// ErrIllegal is returned (wrapped) by Next for an event that is not legal in
// the given state.
var ErrIllegal = errors.New("illegal transition")

// Transition is one legal (state, event, guard) -> state entry of a table.
type Transition struct {
	From  State
	Event Event
	Guard Guard
	To    State
}

// Next is Volumes.Next: the step event e with guard g takes a volume from
// state s. For expand, pass NoGuard: Next answers with the Deferred row
// when the volume is attached. For node_unpublish, pass LastTarget or
// OtherTargets.
func Next(s State, e Event, g Guard) (Step, error) { return Volumes.Next(s, e, g) }

// Check is Volumes.Check.
func Check(from State, e Event, g Guard, to State) error { return Volumes.Check(from, e, g, to) }

// Legal is Volumes.Legal.
func Legal(s State, e Event) bool { return Volumes.Legal(s, e) }

// Inverse returns the event that undoes e in its lifecycle, if e has one.
func Inverse(e Event) (Event, bool) {
	if e.OfSnapshot() {
		return Snapshots.Inverse(e)
	}
	return Volumes.Inverse(e)
}

// Forward returns the event that e undoes in its lifecycle, if e is an
// inverse.
func Forward(e Event) (Event, bool) {
	if e.OfSnapshot() {
		return Snapshots.Forward(e)
	}
	return Volumes.Forward(e)
}

// Transitions is Volumes.Transitions.
func Transitions() []Transition { return Volumes.Transitions() }

// Mermaid is Volumes.Mermaid.
func Mermaid() string { return Volumes.Mermaid() }
