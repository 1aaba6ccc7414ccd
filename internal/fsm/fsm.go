// Package fsm is the volume lifecycle of csid: its states, its events and the
// legal transitions between them, as one declarative table.
//
// The table is built on github.com/looplab/fsm and compiled once, at package
// initialisation, into a lookup map. The package does no I/O and has no
// callbacks with effects: it answers "what does event E do to a volume in
// state S" and nothing else. Every change of a stored volume state in csid
// goes through Next.
package fsm

import (
	"context"
	"errors"
	"fmt"
	"sort"

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

// The lifecycle events. NodeExpand (NodeExpandVolume) is csid's addition to
// the CSI diagram: it grows a staged filesystem and never changes the state.
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
)

// Events lists every event in lifecycle order.
var Events = []Event{Create, ControllerPublish, NodeStage, NodePublish, NodeUnpublish,
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

type key struct {
	state State
	event Event
	guard Guard
}

var (
	machine  *looplab.FSM
	compiled map[key]State
)

func init() {
	m, c, err := compile(table)
	if err != nil {
		panic(err) // the table is a constant; a broken one must not build
	}
	machine, compiled = m, c
}

// label is the name of a row inside looplab: the event, and its guard if any.
func label(e Event, g Guard) string {
	if g == NoGuard {
		return string(e)
	}
	return fmt.Sprintf("%s [%s]", e, g)
}

// compile builds the looplab machine from the rows, then asks it, for every
// state and row, where the row leads: that answer is the lookup map.
func compile(rows []row) (*looplab.FSM, map[key]State, error) {
	var descs looplab.Events
	for _, r := range rows {
		for _, s := range r.src {
			dst := r.dst
			if dst == "" {
				dst = s
			}
			descs = append(descs, looplab.EventDesc{Name: label(r.event, r.guard), Src: []string{string(s)}, Dst: string(dst)})
		}
	}
	m := looplab.NewFSM(string(Absent), descs, nil)
	probe := looplab.NewFSM(string(Absent), descs, nil)
	out := make(map[key]State)
	for _, s := range States {
		for _, r := range rows {
			probe.SetState(string(s))
			l := label(r.event, r.guard)
			if !probe.Can(l) {
				continue
			}
			err := probe.Event(context.Background(), l)
			var noTransition looplab.NoTransitionError
			if err != nil && !errors.As(err, &noTransition) {
				return nil, nil, fmt.Errorf("fsm: row %q from %s: %w", l, s, err)
			}
			k := key{s, r.event, r.guard}
			if _, dup := out[k]; dup {
				return nil, nil, fmt.Errorf("fsm: row %q from %s is declared twice", l, s)
			}
			out[k] = State(probe.Current())
		}
	}
	return m, out, nil
}

// Next returns the step that event e with guard g takes from state s, or an
// error wrapping ErrIllegal. For expand, pass NoGuard: Next answers with the
// Deferred row when the volume is attached. For node_unpublish, pass
// LastTarget or OtherTargets.
func Next(s State, e Event, g Guard) (Step, error) {
	if to, ok := compiled[key{s, e, g}]; ok {
		return Step{Event: e, Guard: g, From: s, To: to}, nil
	}
	if e == Expand && g == NoGuard {
		if to, ok := compiled[key{s, e, Deferred}]; ok {
			return Step{Event: e, Guard: Deferred, From: s, To: to}, nil
		}
	}
	return Step{}, fmt.Errorf("%w: %s in state %s", ErrIllegal, label(e, g), s)
}

// Legal reports whether e (under any guard) is legal in state s.
func Legal(s State, e Event) bool {
	for k := range compiled {
		if k.state == s && k.event == e {
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

// Transitions lists the compiled table, sorted by state order then event order.
func Transitions() []Transition {
	out := make([]Transition, 0, len(compiled))
	for k, to := range compiled {
		out = append(out, Transition{From: k.state, Event: k.event, Guard: k.guard, To: to})
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
	out, err := looplab.VisualizeWithType(machine, looplab.MermaidStateDiagram)
	if err != nil {
		panic(err) // MermaidStateDiagram is a known type
	}
	return out
}
