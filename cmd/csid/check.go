package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/csid-dev/csid/internal/check"
	"github.com/csid-dev/csid/internal/cloud/local"
	"github.com/csid-dev/csid/internal/driver"
	"github.com/csid-dev/csid/internal/mounter"
	"github.com/spf13/cobra"
)

const checkLong = `Compare what csid's records say with what the cloud and this host show, and
print each disagreement with its likely cause and the action to take. It
changes nothing. Exit status: 0 when records, cloud and host agree, 1 when
anything is found (or csid check itself fails).

It reads the records of every csid answering on an admin socket in
--state-dir (admin-all.sock, admin-controller.sock, admin-node.sock), or
those named with --socket, or the state files of stopped csids with --db
(read-only; repeat the flags for several); the local backend's disks in
--state-dir (read-only, without its lock); the loop devices bound to those
disks; and the mount table, where it looks at the mounts kubelet made for
the csids it read (in the kubelet directory each csid says it works in,
for its driver name; --kubelet-root and --driver-name for a state file),
and those of csid's devices and recorded paths. Mounts in another kubelet
directory, or for another driver, are not csid's and are not compared.

Findings: record-damaged, device-mismatch, disk-without-volume, volume-without-disk,
attachment-unknown, attachment-missing, loop-device-unaccounted,
mount-unaccounted, mount-missing (docs/operations.md explains each). A volume with an op in
flight, or whose record changed while csid check read, is left out and
named in a note.

Run it where the node's mounts are: in the node plugin's pod.`

const checkExample = `  # the all-in-one csid in ./csid-data
  sudo csid check

  # in Kubernetes, in the node plugin's pod of a node
  kubectl exec -n csid <csid-node pod> -c csid -- csid check --state-dir /var/lib/csid

  # a stopped csid, for tools
  csid check --db /var/lib/csid/node.db --state-dir /var/lib/csid -o json`

// checkDoc is csid check's document (-o json, -o yaml).
type checkDoc struct {
	// Records are the csid records compared: {name, mode}.
	Records []check.Store `json:"records"`
	// Cloud is the local backend's state directory read ("" when none).
	Cloud string `json:"cloud,omitempty"`
	// HostNodes are the nodes whose devices and mounts are on this host.
	HostNodes []string `json:"hostNodes"`
	// Kubelets are the kubelet directories of the csids read, whose
	// mounts were compared.
	Kubelets []check.Kubelet `json:"kubelets"`
	check.Report
}

func newCheck() *cobra.Command {
	var o checkOptions
	cmd := &cobra.Command{
		Use:     "check",
		Short:   "Compare csid's records with the cloud and the host; explain each disagreement",
		Long:    checkLong,
		Example: checkExample,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.sockets, "socket", nil, "admin socket of a running csid (repeatable; default: every one that answers in --state-dir)")
	f.StringArrayVar(&o.dbs, "db", nil, "state file of a stopped csid, opened read-only (repeatable)")
	f.StringVar(&o.stateDir, "state-dir", "csid-data", "csid's state directory: its admin sockets, and the local backend's disks")
	f.StringVar(&o.kubeletRoot, "kubelet-root", "/var/lib/kubelet", "kubelet's root directory for records whose csid does not say its own (state files; a running csid says; \"\": no kubelet, compare csid's recorded paths only)")
	f.StringVar(&o.nodeID, "node-id", "", "the node this host is (default: the node of the csid read, and the local backend's nodes)")
	f.StringVar(&o.driverName, "driver-name", driver.DefaultName, "csid's CSI driver name, as in kubelet's directories, for records whose csid does not say its own (state files)")
	f.StringVarP(&o.output, "output", "o", outTable, "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", fixedCompletion(outputs...))
	_ = cmd.RegisterFlagCompletionFunc("db", extCompletion("db"))
	_ = cmd.RegisterFlagCompletionFunc("socket", extCompletion("sock"))
	_ = cmd.RegisterFlagCompletionFunc("state-dir", dirCompletion)
	_ = cmd.RegisterFlagCompletionFunc("kubelet-root", dirCompletion)
	return cmd
}

// checkOptions are the flags of `csid check`.
type checkOptions struct {
	sockets, dbs                                      []string
	stateDir, kubeletRoot, nodeID, driverName, output string
}

// run is `csid check`: read the records, the cloud and the host, compare,
// print; findings make it fail (exit 1).
func (o *checkOptions) run(cmd *cobra.Command) error {
	if err := checkOutput(o.output); err != nil {
		return err
	}
	ctx := cmd.Context()
	srcs, err := o.sources(ctx)
	defer func() {
		for _, s := range srcs {
			s.Close()
		}
	}()
	if err != nil {
		return err
	}
	s := check.Sources{DriverName: o.driverName, KubeletRoot: o.kubeletRoot}
	doc := checkDoc{}
	var nodes []string
	for _, src := range srcs {
		rs := check.RecordSource{Name: src.what, Mode: string(src.mode), Source: src}
		if src.info.DriverName != "" { // a live csid says where kubelet keeps its volumes
			rs.Kubelet = &check.Kubelet{DriverName: src.info.DriverName, Root: src.info.KubeletRoot}
		}
		s.Records = append(s.Records, rs)
		doc.Records = append(doc.Records, check.Store{Name: src.what, Mode: string(src.mode)})
		if src.mode != driver.ModeController && src.info.NodeID != "" {
			nodes = append(nodes, src.info.NodeID)
		}
	}
	insp, err := local.OpenInspector(o.stateDir)
	switch {
	case errors.Is(err, local.ErrNoState):
		s.CloudNotRead = fmt.Sprintf("no local backend in %s (--state-dir): the cloud's disks, attachments and loop devices are not compared", o.stateDir)
	case err != nil:
		return err
	default:
		s.Cloud, doc.Cloud = insp, insp.Dir()
		s.Freezes = check.LocalFreezes(insp)
		registered, err := insp.Nodes()
		if err != nil {
			return err
		}
		nodes = append(nodes, registered...)
	}
	if s.HostNodes, err = o.hostNodes(nodes); err != nil {
		return err
	}
	doc.HostNodes = s.HostNodes
	s.Mounts = mounter.New()

	in, err := check.Gather(ctx, s)
	if err != nil {
		return err
	}
	doc.Kubelets = in.Kubelets
	doc.Report = check.Compare(in)
	if err := render(cmd.OutOrStdout(), o.output, doc, func(w io.Writer) error { return printCheck(w, doc) }); err != nil {
		return err
	}
	if !doc.Clean() {
		// An error: exit 1.
		return errors.New("check found " + count(len(doc.Findings), "problem"))
	}
	return nil
}

// sources opens the records to compare: the sockets and state files named,
// else every csid answering in the state directory. The caller closes
// what it gets, also with an error.
func (o *checkOptions) sources(ctx context.Context) ([]*source, error) {
	var srcs []*source
	for _, sock := range o.sockets {
		s, err := openSocket(ctx, sock)
		if err != nil {
			return srcs, err
		}
		srcs = append(srcs, s)
	}
	for _, db := range o.dbs {
		s, err := openDB(db, "check")
		if err != nil {
			return srcs, err
		}
		srcs = append(srcs, s)
	}
	if len(srcs) > 0 {
		return srcs, nil
	}
	live, err := discover(ctx, o.stateDir, "check")
	if err != nil {
		return srcs, err
	}
	for _, l := range live {
		srcs = append(srcs, l.source)
	}
	return srcs, nil
}

// hostNodes is the nodes this host is: --node-id, else the nodes of the
// csids read and the local backend's, else the hostname.
func (o *checkOptions) hostNodes(nodes []string) ([]string, error) {
	if o.nodeID != "" {
		nodes = []string{o.nodeID}
	}
	if len(nodes) == 0 {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("no --node-id and no hostname: %w", err)
		}
		nodes = []string{h}
	}
	slices.Sort(nodes)
	return slices.Compact(nodes), nil
}

// printCheck draws csid check's report for people.
func printCheck(w io.Writer, d checkDoc) error {
	c := d.Checked
	vols := count(c.Volumes, "volume")
	if c.Snapshots > 0 {
		vols += ", " + count(c.Snapshots, "snapshot")
	}
	fmt.Fprintf(w, "Compared %s, %s, %s and %s of csid.\n", vols, count(c.Disks, "disk"), count(c.Devices, "loop device"), count(c.Mounts, "mount"))
	for _, r := range d.Records {
		fmt.Fprintf(w, "  records: %s\n", r.Name)
	}
	if d.Cloud != "" {
		fmt.Fprintf(w, "  cloud:   local backend in %s\n", d.Cloud)
	}
	var roots []string
	for _, k := range d.Kubelets {
		roots = append(roots, fmt.Sprintf("%s (%s)", k.Root, k.DriverName))
	}
	kubelet := "kubelet root none"
	switch len(roots) {
	case 0:
	case 1:
		kubelet = "kubelet root " + roots[0]
	default:
		kubelet = "kubelet roots " + strings.Join(roots, ", ")
	}
	fmt.Fprintf(w, "  host:    nodes %s; %s\n", strings.Join(d.HostNodes, ", "), kubelet)
	switch {
	case d.Clean() && len(d.Notes) > 0:
		fmt.Fprintln(w, "\nNo problems in what could be compared; the notes say what could not.")
	case d.Clean():
		fmt.Fprintln(w, "\nNo problems: records, cloud and host agree.")
	default:
		fmt.Fprintf(w, "\n%s:\n", count(len(d.Findings), "problem"))
		for i, f := range d.Findings {
			fmt.Fprintf(w, "\n[%d] %s\n", i+1, f.Kind)
			fmt.Fprint(w, wrap("problem: ", f.Problem))
			fmt.Fprint(w, wrap("cause:   ", f.Cause))
			fmt.Fprint(w, wrap("action:  ", f.Action))
		}
	}
	if len(d.Notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, n := range d.Notes {
		fmt.Fprint(w, wrap("note: ", n))
	}
	return nil
}

// count is "1 disk", "2 disks".
func count(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// wrap writes text after label, wrapped at 100 columns and indented under
// the label's end.
func wrap(label, text string) string {
	const width = 100
	pad := "    " + strings.Repeat(" ", len(label))
	var b strings.Builder
	b.WriteString("    " + label)
	col := len(pad)
	for i, word := range strings.Fields(text) {
		if i > 0 && col+1+len(word) > width {
			b.WriteString("\n" + pad)
			col = len(pad)
		} else if i > 0 {
			b.WriteByte(' ')
			col++
		}
		b.WriteString(word)
		col += len(word)
	}
	b.WriteByte('\n')
	return b.String()
}
