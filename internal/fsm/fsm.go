// Package fsm is the volume lifecycle of csid: its states, its events and the
// legal transitions between them, as one declarative table.
//
// The table is executed by github.com/looplab/fsm: Next puts a looplab
// machine in the volume's state and fires the event's Event call, and
// looplab decides whether it is legal and where it leads. The package does
// no I/O and has no callbacks with effects: it answers "what does event E
// do to a volume in state S" and nothing else. Every change of a stored
// volume state in csid goes through Next (internal/store refuses a state
// write without a legal step), CSI calls and reconciliation alike.
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

// States lists every state, Absent first, in lifecycle order.
var States = []State{Absent, Created, NodeReady, VolReady, Published}

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
	// it (no staging, no target).
	Forget Event = "forget"
)

// Events lists every event in lifecycle order.
var Events = append(slices.Clone(OpEvents), Adopt, Rebuild, Rollback, Forget)

// OpEvents lists the events that are asked for (CSI calls), which the
// operation engine runs as ops; the others record what csid finds.
var OpEvents = []Event{Create, ControllerPublish, NodeStage, NodePublish, NodeUnpublish,
	NodeUnstage, ControllerUnpublish, Delete, Expand, NodeExpand}

// Valid reports whether s is one of the lifecycle states.
func (s State) Valid() bool {
	for _, x := range States {
		if s == x {
			return true
		}
	}
	return false
}

// Valid reports whether e is one of the lifecycle events.
func (e Event) Valid() bool {
	for _, x := range Events {
		if e == x {
			return true
		}
	}
	return false
}

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

// row is one line of the transition table.
type row struct {
	event Event
	guard Guard
	src   []State
	dst   State // "" means "stay in the source state"
}

// table is the lifecycle: the one place that says which event is legal in
// which state and where it leads.
var table = []row{
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

// inverses pairs each forward event with the event that undoes it. A failed
// forward operation is compensated by its inverse's effect, and an inverse
// other than delete that arrives while its forward event is in flight
// cancels it (internal/ops decides which).
var inverses = map[Event]Event{
	Create:            Delete,
	ControllerPublish: ControllerUnpublish,
	NodeStage:         NodeUnstage,
	NodePublish:       NodeUnpublish,
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

func init() {
	if err := validate(table); err != nil {
		panic(err) // the table is a constant; a broken one must not build
	}
}

// validate checks that every row names known states and events and that no
// (event, guard, state) is declared twice: looplab would silently keep the
// last of two.
func validate(rows []row) error {
	type key struct {
		e Event
		g Guard
		s State
	}
	seen := map[key]bool{}
	for _, r := range rows {
		if !r.event.Valid() || (r.dst != "" && !r.dst.Valid()) {
			return fmt.Errorf("fsm: row %q names an unknown event or state", label(r.event, r.guard))
		}
		for _, s := range r.src {
			k := key{r.event, r.guard, s}
			if !s.Valid() || seen[k] {
				return fmt.Errorf("fsm: row %q from %s is unknown or declared twice", label(r.event, r.guard), s)
			}
			seen[k] = true
		}
	}
	return nil
}

// descs is the table in looplab's terms: one event description per row and
// source state, named by label.
var descs = func() looplab.Events {
	var out looplab.Events
	for _, r := range table {
		for _, s := range r.src {
			dst := r.dst
			if dst == "" {
				dst = s
			}
			out = append(out, looplab.EventDesc{Name: label(r.event, r.guard), Src: []string{string(s)}, Dst: string(dst)})
		}
	}
	return out
}()

// machines holds looplab machines over the table. A looplab FSM has one
// current state, so each decision takes a machine of its own, puts it in
// the volume's state and fires the event.
var machines = sync.Pool{New: func() any { return looplab.NewFSM(string(Absent), descs, nil) }}

// label is the name of a row inside looplab: the event, and its guard if any.
func label(e Event, g Guard) string {
	if g == NoGuard {
		return string(e)
	}
	return fmt.Sprintf("%s [%s]", e, g)
}

// fire asks looplab where event e under guard g leads from state s.
func fire(s State, e Event, g Guard) (State, bool) {
	m := machines.Get().(*looplab.FSM)
	defer machines.Put(m)
	m.SetState(string(s))
	err := m.Event(context.Background(), label(e, g))
	var same looplab.NoTransitionError
	if err != nil && !errors.As(err, &same) {
		return "", false
	}
	return State(m.Current()), true
}

// Next returns the step that event e with guard g takes from state s, as
// looplab executes the table, or an error wrapping ErrIllegal. For expand,
// pass NoGuard: Next answers with the Deferred row when the volume is
// attached. For node_unpublish, pass LastTarget or OtherTargets.
func Next(s State, e Event, g Guard) (Step, error) {
	if to, ok := fire(s, e, g); ok {
		return Step{Event: e, Guard: g, From: s, To: to}, nil
	}
	if e == Expand && g == NoGuard {
		if to, ok := fire(s, e, Deferred); ok {
			return Step{Event: e, Guard: Deferred, From: s, To: to}, nil
		}
	}
	return Step{}, fmt.Errorf("%w: %s in state %s", ErrIllegal, label(e, g), s)
}

// Check returns nil when event e under guard g takes a volume from state
// from to state to, and an error wrapping ErrIllegal otherwise. The store
// calls it for every state it writes.
func Check(from State, e Event, g Guard, to State) error {
	step, err := Next(from, e, g)
	if err != nil {
		return err
	}
	if step.To != to || step.Guard != g {
		return fmt.Errorf("%w: %s leads from %s to %s, not to %s", ErrIllegal, label(e, g), from, step.To, to)
	}
	return nil
}

// Legal reports whether e (under any guard) is legal in state s.
func Legal(s State, e Event) bool {
	m := machines.Get().(*looplab.FSM)
	defer machines.Put(m)
	m.SetState(string(s))
	for _, r := range table {
		if r.event == e && m.Can(label(e, r.guard)) {
			return true
		}
	}
	return false
}

// Inverse returns the event that undoes e, if e has one.
func Inverse(e Event) (Event, bool) {
	inv, ok := inverses[e]
	return inv, ok
}

// Forward returns the event that e undoes, if e is an inverse.
func Forward(e Event) (Event, bool) {
	for f, inv := range inverses {
		if inv == e {
			return f, true
		}
	}
	return "", false
}

// Transition is one legal (state, event, guard) -> state entry of the table.
type Transition struct {
	From  State
	Event Event
	Guard Guard
	To    State
}

// Transitions lists every legal (state, event, guard) of the table with
// where looplab takes it, sorted by state order then event order.
func Transitions() []Transition {
	var out []Transition
	for _, r := range table {
		for _, s := range r.src {
			if to, ok := fire(s, r.event, r.guard); ok {
				out = append(out, Transition{From: s, Event: r.event, Guard: r.guard, To: to})
			}
		}
	}
	order := func(s State) int {
		for i, x := range States {
			if x == s {
				return i
			}
		}
		return len(States)
	}
	evOrder := func(e Event) int {
		for i, x := range Events {
			if x == e {
				return i
			}
		}
		return len(Events)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if order(a.From) != order(b.From) {
			return order(a.From) < order(b.From)
		}
		if evOrder(a.Event) != evOrder(b.Event) {
			return evOrder(a.Event) < evOrder(b.Event)
		}
		return a.Guard < b.Guard
	})
	return out
}

// Mermaid draws the lifecycle as a Mermaid state diagram, with looplab's
// visualizer. docs/state-machine.md holds this drawing; a test keeps the two
// equal.
func Mermaid() string {
	out, err := looplab.VisualizeWithType(looplab.NewFSM(string(Absent), descs, nil), looplab.MermaidStateDiagram)
	if err != nil {
		panic(err) // MermaidStateDiagram is a known type
	}
	return out
}
