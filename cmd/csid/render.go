package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/csid-dev/csid/internal/view"
	"sigs.k8s.io/yaml"
)

// Output formats of -o.
const (
	outTable = "table"
	outJSON  = "json"
	outYAML  = "yaml"
)

var outputs = []string{outTable, outJSON, outYAML}

func checkOutput(o string) error {
	if !slices.Contains(outputs, o) {
		return fmt.Errorf("-o %q: one of %s", o, strings.Join(outputs, ", "))
	}
	return nil
}

// encodeJSON writes v as indented JSON: the documents of package view,
// with their field names.
func encodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// encodeYAML writes v as YAML with the same field names as its JSON.
func encodeYAML(w io.Writer, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	out, err := yaml.JSONToYAML(raw)
	if err != nil {
		return err
	}
	_, err = w.Write(out)
	return err
}

// render writes v in format o; table draws the table.
func render(w io.Writer, o string, v any, table func(w io.Writer) error) error {
	switch o {
	case outJSON:
		return encodeJSON(w, v)
	case outYAML:
		return encodeYAML(w, v)
	}
	return table(w)
}

// printer draws tables and detail blocks relative to a clock (for ages).
type printer struct {
	now time.Time
}

func newTab(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// size is a byte count for people: binary units, one decimal when needed.
func size(n int64) string {
	if n == 0 {
		return "0"
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB", "PiB"}
	v, u := float64(n), 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %s", int64(v), units[u])
	}
	return fmt.Sprintf("%.1f %s", v, units[u])
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stamp is a time in UTC to the second, "-" for none.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// age is how long ago t was, kubectl style ("3m12s", "2h5m", "3d4h").
func (p printer) age(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := p.now.Sub(t)
	if d < 0 {
		return "in " + shortDuration(-d)
	}
	return shortDuration(d)
}

func shortDuration(d time.Duration) string {
	d = d.Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

// stampAge is "2026-03-01T09:00:00Z (3m12s ago)".
func (p printer) stampAge(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	a := p.age(t)
	if !strings.HasPrefix(a, "in ") {
		a += " ago"
	}
	return fmt.Sprintf("%s (%s)", stamp(t), a)
}

func event(e, g string) string {
	if g == "" {
		return e
	}
	return e + " [" + g + "]"
}

// pendingCell summarises a pending op for a table cell.
func (p printer) pendingCell(o *view.Op) string {
	if o == nil {
		return "-"
	}
	s := fmt.Sprintf("#%d %s (", o.Seq, o.Event)
	if o.Status == view.StatusCompensating {
		s += "compensating, "
	}
	s += "for " + p.age(o.CreatedAt)
	if o.Attempts > 0 {
		s += fmt.Sprintf(", %d failed attempts", o.Attempts)
	}
	return s + ")"
}

// outcome is how an op ended (or how far it is) in a few words.
func outcome(o *view.Op) string {
	switch o.Status {
	case view.StatusSucceeded:
		return "ok"
	case view.StatusFailed:
		return "failed: " + o.Code
	}
	return o.Status
}

func lastCell(o *view.Op) string {
	if o == nil {
		return "-"
	}
	return fmt.Sprintf("#%d %s %s", o.Seq, o.Event, outcome(o))
}

func resizeCell(r *view.Resize) string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%s to %s", r.Status, size(r.TargetBytes))
}

// volumes draws `csid inspect volumes`.
func (p printer) volumes(w io.Writer, l view.VolumeList) error {
	if len(l.Volumes) == 0 {
		_, err := fmt.Fprintln(w, "No volumes.")
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tSIZE\tNODE\tPENDING OP\tRESIZE\tLAST OP")
	var damaged []string
	for _, v := range l.Volumes {
		sz := "-"
		if v.CapacityBytes > 0 {
			sz = size(v.CapacityBytes)
		}
		state := string(v.State)
		if v.Damage != "" {
			state = "DAMAGED"
			if v.State != "" {
				state = fmt.Sprintf("DAMAGED (%s)", v.State)
			}
			damaged = append(damaged, v.ID+": "+v.Damage)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", v.ID, dash(v.Name), state, sz, dash(v.Node),
			p.pendingCell(v.PendingOp), resizeCell(v.Resize), lastCell(v.LastOp))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	damagedRecords(w, "volumes", damaged)
	return nil
}

// damagedRecords writes, below a list's table, the lines "id: damage" of
// the damaged records (volumes or snapshots) it lists, if any.
func damagedRecords(w io.Writer, what string, damaged []string) {
	if len(damaged) == 0 {
		return
	}
	fmt.Fprintf(w, "\nDamaged records: csid does not act on these %s (their RPCs answer DataLoss); csid check says what to do:\n", what)
	for _, d := range damaged {
		fmt.Fprintf(w, "  %s\n", d)
	}
}

// volume draws `csid inspect volume ID`: the record, the pending op, the
// resize, the last op, then the history.
func (p printer) volume(w io.Writer, v view.Volume) error {
	sh := sheet{newTab(w)}
	sh.row("Volume:", "%s", v.ID)
	if v.Damage != "" {
		sh.damaged("volume", v.Damage)
		if v.State == "" {
			return sh.tw.Flush() // its own record is unreadable: nothing more is known
		}
	}
	p.volumeRecord(sh, v)
	p.volumeOps(sh, v)
	if err := sh.tw.Flush(); err != nil {
		return err
	}
	return volumeHistory(w, v.History)
}

// sheet is a two-column table of labelled lines.
type sheet struct{ tw *tabwriter.Writer }

// row writes a labelled line; more, a line that continues the one above.
func (s sheet) row(k, format string, a ...any) {
	fmt.Fprintf(s.tw, "%s\t"+format+"\n", append([]any{k}, a...)...)
}
func (s sheet) more(format string, a ...any) { fmt.Fprintf(s.tw, "\t"+format+"\n", a...) }

// damaged writes the damage of a record (of a volume or a snapshot) and
// what it means.
func (s sheet) damaged(what, damage string) {
	s.row("DAMAGED:", "%s", damage)
	s.more("csid does not act on this %s: its RPCs answer DataLoss; csid check says what to do", what)
}

// volumeRecord writes what a volume's record holds: name, state, disk,
// size, access, where it is attached, staged and published, and when.
func (p printer) volumeRecord(sh sheet, v view.Volume) {
	sh.row("Name:", "%s", dash(v.Name))
	sh.row("State:", "%s (generation %d)", v.State, v.Generation)
	if v.DiskID != "" {
		sh.row("Disk:", "%s in zone %s", v.DiskID, dash(v.Zone))
	} else {
		sh.row("Disk:", "none yet")
	}
	sh.row("Size:", "%s (%d bytes)", size(v.CapacityBytes), v.CapacityBytes)
	access := []string{dash(v.AccessType)}
	if v.FsType != "" {
		access = append(access, v.FsType)
	}
	if v.AccessMode != "" {
		access = append(access, v.AccessMode)
	}
	if len(v.MountFlags) > 0 {
		access = append(access, "mount flags "+strings.Join(v.MountFlags, ","))
	}
	sh.row("Access:", "%s", strings.Join(access, ", "))
	if src := v.Source; src != nil && src.SnapshotID != "" {
		sh.row("Source:", "snapshot %s", src.SnapshotID)
	} else if src != nil {
		sh.row("Source:", "volume %s (a clone)", src.VolumeID)
	}
	if len(v.Parameters) > 0 {
		sh.row("Parameters:", "%s", pairs(v.Parameters))
	}
	if v.Node != "" {
		ro := "read-write"
		if v.ReadOnly {
			ro = "read-only"
		}
		sh.row("Attached to:", "%s (%s)", v.Node, ro)
		if len(v.PublishContext) > 0 {
			sh.row("Publish context:", "%s", pairs(v.PublishContext))
		}
	} else {
		sh.row("Attached to:", "none")
	}
	if v.StagingPath != "" {
		sh.row("Staged at:", "%s (device %s)", v.StagingPath, dash(v.Device))
	}
	for i, t := range v.Targets {
		ro := ""
		if t.ReadOnly {
			ro = " (read-only)"
		}
		if i == 0 {
			sh.row("Published at:", "%s%s", t.Path, ro)
		} else {
			sh.more("%s%s", t.Path, ro)
		}
	}
	sh.row("Created:", "%s", p.stampAge(v.CreatedAt))
	sh.row("Updated:", "%s", p.stampAge(v.UpdatedAt))
}

// volumeOps writes the op in flight on a volume, its queued resize and its
// last op.
func (p printer) volumeOps(sh sheet, v view.Volume) {
	p.pendingOp(sh, v.PendingOp)
	if r := v.Resize; r != nil {
		sh.row("Resize:", "%s to %s (now %s) since %s", r.Status, size(r.TargetBytes), size(r.CurrentBytes), p.stampAge(r.QueuedAt))
		sh.more("%s", waitingFor(r))
		if r.Attempts > 0 {
			sh.more("%d failed attempts; last error: %s", r.Attempts, r.LastError)
		} else if r.LastError != "" {
			sh.more("last error: %s", r.LastError)
		}
		if !r.NextAttemptAt.IsZero() {
			sh.more("next attempt at %s", p.stampAge(r.NextAttemptAt))
		}
	} else {
		sh.row("Resize:", "none queued")
	}
	p.lastOp(sh, v.LastOp)
}

// pendingOp writes the op in flight on a volume or a snapshot: its
// transition, its failed attempts, its next attempt and its arguments.
func (p printer) pendingOp(sh sheet, o *view.Op) {
	if o == nil {
		sh.row("Pending op:", "none")
		return
	}
	sh.row("Pending op:", "#%d %s %s -> %s, %s since %s", o.Seq, event(string(o.Event), string(o.Guard)), o.From, o.To, o.Status, p.stampAge(o.CreatedAt))
	if o.Attempts > 0 {
		sh.more("%d failed attempts; last error: %s", o.Attempts, o.LastError)
	}
	if !o.NextAttemptAt.IsZero() {
		sh.more("next attempt at %s", p.stampAge(o.NextAttemptAt))
	}
	if len(o.Args) > 0 {
		sh.more("arguments: %s", o.Args)
	}
}

// lastOp writes the last finished op of a volume or a snapshot, with the
// gRPC code and message of a failed one; nothing when there is none.
func (p printer) lastOp(sh sheet, o *view.Op) {
	if o == nil {
		return
	}
	sh.row("Last op:", "#%d %s %s -> %s %s at %s", o.Seq, event(string(o.Event), string(o.Guard)), o.From, o.To, o.Status, p.stampAge(o.FinishedAt))
	if o.Status == view.StatusFailed {
		sh.more("%s: %s", o.Code, o.Message)
	}
}

// volumeHistory writes a volume's history, oldest first.
func volumeHistory(w io.Writer, history []view.HistoryLine) error {
	fmt.Fprintf(w, "\nHistory (oldest first):\n")
	if len(history) == 0 {
		_, err := fmt.Fprintln(w, "  none")
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "TIME\tEVENT\tFROM\tTO\tOP\tOUTCOME")
	for _, h := range history {
		op := "-"
		if h.Op != 0 {
			op = fmt.Sprintf("#%d", h.Op)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", stamp(h.Time), event(string(h.Event), string(h.Guard)), h.From, h.To, op, h.Outcome)
	}
	return tw.Flush()
}

// waitingFor says what a resize waits for, and what the operator can do.
func waitingFor(r *view.Resize) string {
	switch {
	case r.Status == view.ResizeRunning:
		return fmt.Sprintf("running: op #%d is growing the disk", r.OpSeq)
	case r.Node != "":
		return fmt.Sprintf("waits for the detach from %s: scale the workload to zero or move it (docs/operations.md)", r.Node)
	case r.LastError != "":
		return "waits for its retry after a failure"
	}
	return "waits for the volume to be idle; starts when its op in flight finishes (or at the next sweep, every 30s)"
}

func pairs(m map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return strings.Join(out, ", ")
}

// ops draws `csid inspect ops`.
func (p printer) ops(w io.Writer, l view.OpList) error {
	if len(l.Ops) == 0 {
		_, err := fmt.Fprintln(w, "No ops.")
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "OP\tVOLUME OR SNAPSHOT\tEVENT\tFROM -> TO\tSTATUS\tATTEMPTS\tCREATED\tAGE\tFINISHED\tDETAIL")
	for _, o := range l.Ops {
		detail := ""
		switch {
		case o.Status == view.StatusFailed:
			detail = o.Code + ": " + o.Message
		case o.Pending() && o.LastError != "":
			detail = "last error: " + o.LastError
			if !o.NextAttemptAt.IsZero() {
				detail += "; next attempt " + stamp(o.NextAttemptAt)
			}
		}
		fmt.Fprintf(tw, "#%d\t%s\t%s\t%s -> %s\t%s\t%d\t%s\t%s\t%s\t%s\n", o.Seq, cmp.Or(o.VolumeID, o.SnapshotID), event(string(o.Event), string(o.Guard)),
			o.From, o.To, o.Status, o.Attempts, stamp(o.CreatedAt), p.age(o.CreatedAt), stamp(o.FinishedAt), dash(detail))
	}
	return tw.Flush()
}

// resizes draws `csid inspect resizes`.
func (p printer) resizes(w io.Writer, l view.ResizeList) error {
	if len(l.Resizes) == 0 {
		_, err := fmt.Fprintln(w, "No resizes queued.")
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "VOLUME\tSTATE\tNODE\tSIZE\tTARGET\tSTATUS\tATTEMPTS\tQUEUED\tAGE\tWAITING FOR")
	for _, r := range l.Resizes {
		wait := waitingFor(&r)
		if r.LastError != "" {
			wait += "; last error: " + r.LastError
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", r.VolumeID, dash(string(r.VolumeState)), dash(r.Node),
			size(r.CurrentBytes), size(r.TargetBytes), r.Status, r.Attempts, stamp(r.QueuedAt), p.age(r.QueuedAt), wait)
	}
	return tw.Flush()
}

// snapshots draws `csid inspect snapshots`.
func (p printer) snapshots(w io.Writer, l view.SnapshotList) error {
	if len(l.Snapshots) == 0 {
		_, err := fmt.Fprintln(w, "No snapshots.")
		return err
	}
	tw := newTab(w)
	fmt.Fprintln(tw, "ID\tNAME\tSTATE\tSIZE\tSOURCE VOLUME\tCUT\tPENDING OP\tLAST OP")
	var damaged []string
	for _, s := range l.Snapshots {
		state, sz, cut := string(s.State), "-", "-"
		if s.Damage != "" {
			state = "DAMAGED"
			damaged = append(damaged, s.ID+": "+s.Damage)
		}
		if s.SizeBytes > 0 {
			sz = size(s.SizeBytes)
		}
		if !s.CutAt.IsZero() {
			cut = stamp(s.CutAt)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.ID, dash(s.Name), state, sz, dash(s.SourceVolumeID), cut,
			p.pendingCell(s.PendingOp), lastCell(s.LastOp))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	damagedRecords(w, "snapshots", damaged)
	return nil
}

// snapshot draws `csid inspect snapshot ID`: the record, its ops, then the
// history.
func (p printer) snapshot(w io.Writer, s view.Snapshot) error {
	sh := sheet{newTab(w)}
	sh.row("Snapshot:", "%s", s.ID)
	if s.Damage != "" {
		sh.damaged("snapshot", s.Damage)
		if s.State == "" {
			return sh.tw.Flush()
		}
	}
	sh.row("Name:", "%s", dash(s.Name))
	sh.row("State:", "%s (generation %d)", s.State, s.Generation)
	sh.row("Source volume:", "%s (disk %s)", dash(s.SourceVolumeID), dash(s.SourceDiskID))
	if s.CloudID != "" {
		ready := "ready to use"
		if !s.ReadyToUse {
			ready = "not ready yet"
		}
		sh.row("Provider snapshot:", "%s in zone %s, %s", s.CloudID, dash(s.Zone), ready)
		sh.row("Size:", "%s (%d bytes): the smallest volume it restores to", size(s.SizeBytes), s.SizeBytes)
		sh.row("Cut:", "%s", p.stampAge(s.CutAt))
	} else {
		sh.row("Provider snapshot:", "none yet")
	}
	if len(s.Parameters) > 0 {
		sh.row("Parameters:", "%s", pairs(s.Parameters))
	}
	sh.row("Created:", "%s", p.stampAge(s.CreatedAt))
	sh.row("Updated:", "%s", p.stampAge(s.UpdatedAt))
	p.pendingOp(sh, s.PendingOp)
	p.lastOp(sh, s.LastOp)
	if err := sh.tw.Flush(); err != nil {
		return err
	}
	return volumeHistory(w, s.History)
}
