// Package cloudtest is the contract of package cloud as a test suite: every
// provider runs the same cases (the local backend and the fake alike), so
// the engine can be tested against the fake and trusted on the real thing.
package cloudtest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/csid-dev/csid/internal/cloud"
	"github.com/csid-dev/csid/internal/testutil"
)

// Provider is a provider under test.
type Provider struct {
	// Cloud is a client on an empty provider.
	Cloud cloud.Cloud
	// AddNode makes a node known to the provider. Nil means registering it
	// through cloud.Registrar, which Cloud must then implement.
	AddNode func(t *testing.T, node cloud.Node)
	// Reopen returns a new client on the same provider state, as csid has
	// after a restart; the suite no longer uses the previous client.
	Reopen func(t *testing.T) cloud.Cloud
	// Host returns the node side of the provider for a node, or is nil when
	// the provider has none to test.
	Host func(t *testing.T, nodeID string) cloud.Host
	// HostNeedsRoot marks the Host cases root-only (they skip, or fail
	// under CSID_REQUIRE_ROOT=1, without it).
	HostNeedsRoot bool
	// WriteDisk and ReadDisk reach a detached disk's content, as a node
	// would through its device, for the cases of snapshots and clones to
	// check what was copied. Nil: those cases check sizes and sources
	// only.
	WriteDisk func(t *testing.T, diskID string, off int64, data []byte)
	ReadDisk  func(t *testing.T, diskID string, off int64, n int) []byte
	// MaxAttachments, when set, is the attach limit the provider reports
	// for every node (a setting of the provider, as Yandex's: its API does
	// not say), whatever the limit AddNode gave the node; the provider
	// still enforces the node's own.
	MaxAttachments int
}

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// timeout bounds every wait of the suite, so that a hung provider fails the
// test instead of the whole run.
const timeout = 30 * time.Second

// Run runs the contract against the providers newProvider makes, one fresh
// provider per case.
func Run(t *testing.T, newProvider func(t *testing.T) Provider) {
	cases := []contractCase{
		{"CreateIsIdempotentByName", testCreateIdempotent},
		{"CreateSameNameOtherSizeIsAlreadyExists", testCreateAlreadyExists},
		{"CreateRejectsBadSpecs", testCreateInvalid},
		{"ConcurrentCreatesOfOneNameMakeOneDisk", testCreateConcurrent},
		{"DeleteIsIdempotent", testDeleteIdempotent},
		{"DeleteOfAttachedDiskIsRefused", testDeleteAttached},
		{"AttachAndDetachAreIdempotent", testAttachDetachIdempotent},
		{"SecondNodeAttachIsRefused", testSecondNode},
		{"ResizeOnlyWhileDetached", testResizeOffline},
		{"TagsUpdateIdempotently", testUpdateTags},
		{"ListPages", testListPaging},
		{"OperationResumesByID", testOperationResume},
		{"DoneOperationsAreVisibleAtOnce", testDoneVisible},
		{"AttachLimit", testAttachLimit},
		{"UnknownAndMalformed", testUnknown},
		{"CapacityAndZones", testCapacity},
		{"NodeRegistration", testNodes},
		{"HostFindsAttachedDisks", testHost},
	}
	cases = append(cases, snapshotCases...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := newProvider(t)
			h := &harness{t: t, p: p, c: p.Cloud}
			tc.fn(t, h)
		})
	}
}

type contractCase struct {
	name string
	fn   func(t *testing.T, h *harness)
}

type harness struct {
	t *testing.T
	p Provider
	c cloud.Cloud
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return c
}

func (h *harness) addNode(n cloud.Node) {
	h.t.Helper()
	if h.p.AddNode != nil {
		h.p.AddNode(h.t, n)
		return
	}
	r, ok := h.c.(cloud.Registrar)
	if !ok {
		h.t.Fatalf("%T implements neither Provider.AddNode nor cloud.Registrar", h.c)
	}
	if err := r.RegisterNode(ctx(h.t), n); err != nil {
		h.t.Fatalf("register node %+v: %v", n, err)
	}
}

// do waits for the operation a call started and returns the disk it left,
// failing the test on any error.
func (h *harness) do(op cloud.Operation, err error) cloud.Disk {
	h.t.Helper()
	return Done(h.t, h.c)(op, err)
}

// Done returns a function that waits on c for the operation a call
// started and returns the disk it left, failing the test on an error of
// the call or of the operation: Done(t, c)(c.AttachDisk(...)).
func Done(t testing.TB, c cloud.Cloud) func(cloud.Operation, error) cloud.Disk {
	return func(op cloud.Operation, err error) cloud.Disk {
		t.Helper()
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		if op.ID == "" {
			t.Fatalf("call returned an operation without an id: %+v", op)
		}
		d, err := c.WaitOperation(ctx(t), op.ID)
		if err != nil {
			t.Fatalf("operation %+v: %v", op, err)
		}
		return d
	}
}

// refused asserts that a call failed by itself with want, starting nothing.
func (h *harness) refused(what string, op cloud.Operation, err, want error) {
	h.t.Helper()
	if !errors.Is(err, want) {
		h.t.Fatalf("%s: got (%+v, %v), want the call to fail with %v", what, op, err, want)
	}
}

func (h *harness) create(name string, size int64) cloud.Disk {
	h.t.Helper()
	return h.do(h.c.CreateDisk(ctx(h.t), cloud.DiskSpec{Name: name, SizeBytes: size}))
}

func (h *harness) get(id string) cloud.Disk {
	h.t.Helper()
	d, err := h.c.GetDisk(ctx(h.t), id)
	if err != nil {
		h.t.Fatalf("GetDisk(%s): %v", id, err)
	}
	return d
}

func (h *harness) gone(id string) {
	h.t.Helper()
	if d, err := h.c.GetDisk(ctx(h.t), id); !errors.Is(err, cloud.ErrNotFound) {
		h.t.Fatalf("GetDisk(%s) = (%+v, %v), want ErrNotFound", id, d, err)
	}
}

// listAll pages through ListDisks and returns the disk IDs in order.
func (h *harness) listAll(pageSize int) []string {
	h.t.Helper()
	return h.listFrom(cloud.ListOptions{MaxResults: pageSize})
}

// listFrom pages through ListDisks from opts (its token, its page size) to
// the end and returns the disk IDs in order.
func (h *harness) listFrom(opts cloud.ListOptions) []string {
	h.t.Helper()
	return pageThrough(h.t, "ListDisks", opts.PageToken, opts.MaxResults, func(token string) ([]string, string, error) {
		opts.PageToken = token
		page, err := h.c.ListDisks(ctx(h.t), opts)
		ids := make([]string, len(page.Disks))
		for i, d := range page.Disks {
			ids[i] = d.ID
		}
		return ids, page.NextToken, err
	})
}

// pageThrough calls list (ListDisks, ListSnapshots: one page from a
// token) from token to the last page and returns the ids in order. No
// page may hold more than maxResults ids, when it is set.
func pageThrough(t *testing.T, method, token string, maxResults int, list func(token string) (ids []string, next string, err error)) []string {
	t.Helper()
	var all []string
	for range 1000 {
		ids, next, err := list(token)
		if err != nil {
			t.Fatalf("%s from token %q, pages of %d: %v", method, token, maxResults, err)
		}
		if maxResults > 0 && len(ids) > maxResults {
			t.Fatalf("%s gave a page of %d, asked for at most %d", method, len(ids), maxResults)
		}
		all = append(all, ids...)
		if next == "" {
			return all
		}
		token = next
	}
	t.Fatalf("%s never ended", method)
	return nil
}

func testCreateIdempotent(t *testing.T, h *harness) {
	spec := cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib, Tags: map[string]string{"csid/volume": "pvc-1"}}
	first := h.do(h.c.CreateDisk(ctx(t), spec))
	if first.ID == "" || first.Name != spec.Name || first.SizeBytes < spec.SizeBytes || first.AttachedTo != "" {
		t.Fatalf("created %+v from %+v", first, spec)
	}
	if first.Tags["csid/volume"] != "pvc-1" {
		t.Errorf("tags = %v, want those of the spec", first.Tags)
	}
	if zones := h.c.Zones(); len(zones) > 0 && first.Zone != zones[0] {
		t.Errorf("zone = %q, want the default %q", first.Zone, zones[0])
	}
	if first.CreatedAt.IsZero() {
		t.Error("CreatedAt is zero")
	}
	second := h.do(h.c.CreateDisk(ctx(t), spec))
	if second.ID != first.ID || second.SizeBytes != first.SizeBytes {
		t.Fatalf("repeat create made %+v, want %+v", second, first)
	}
	if got := h.get(first.ID); got.ID != first.ID || got.Name != spec.Name || got.SizeBytes != first.SizeBytes {
		t.Fatalf("GetDisk = %+v, want %+v", got, first)
	}
	// A size that rounds to the same size is the same request.
	if third := h.create(spec.Name, spec.SizeBytes-1); third.ID != first.ID {
		t.Fatalf("create with %d bytes made %s, want %s (sizes round up)", spec.SizeBytes-1, third.ID, first.ID)
	}
	if ids := h.listAll(0); !slices.Equal(ids, []string{first.ID}) {
		t.Fatalf("ListDisks = %v, want only %s", ids, first.ID)
	}
}

func testCreateAlreadyExists(t *testing.T, h *harness) {
	d := h.create("pvc-1", gib)
	op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-1", SizeBytes: 2 * gib})
	h.refused("create with another size", op, err, cloud.ErrAlreadyExists)
	if got := h.get(d.ID); got.SizeBytes != d.SizeBytes {
		t.Fatalf("the refused create changed the disk: %+v", got)
	}
}

func testCreateInvalid(t *testing.T, h *harness) {
	for _, spec := range []cloud.DiskSpec{
		{Name: "", SizeBytes: gib},
		{Name: "pvc-1", SizeBytes: 0},
		{Name: "pvc-1", SizeBytes: -1},
		{Name: "pvc-1", SizeBytes: gib, Zone: "no-such-zone"},
		{Name: "pvc-1", SizeBytes: h.c.MaxDiskBytes() + 1},
	} {
		op, err := h.c.CreateDisk(ctx(t), spec)
		h.refused(fmt.Sprintf("create %+v", spec), op, err, cloud.ErrInvalid)
	}
	if ids := h.listAll(0); len(ids) != 0 {
		t.Fatalf("refused creates left disks: %v", ids)
	}
}

func testCreateConcurrent(t *testing.T, h *harness) {
	const n = 8
	ids := make([]string, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-race", SizeBytes: gib})
			if err != nil {
				errs[i] = err
				return
			}
			d, err := h.c.WaitOperation(ctx(t), op.ID)
			ids[i], errs[i] = d.ID, err
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("create %d: %v", i, errs[i])
		}
		if ids[i] != ids[0] {
			t.Fatalf("concurrent creates of one name made disks %v", ids)
		}
	}
	if got := h.listAll(0); !slices.Equal(got, ids[:1]) {
		t.Fatalf("ListDisks = %v, want only %s", got, ids[0])
	}
}

func testDeleteIdempotent(t *testing.T, h *harness) {
	d := h.create("pvc-1", gib)
	if left := h.do(h.c.DeleteDisk(ctx(t), d.ID)); left.ID != "" {
		t.Fatalf("a finished delete returned %+v, want the zero Disk", left)
	}
	h.gone(d.ID)
	// Deleting what is gone is success, and so is waiting on it again.
	op, err := h.c.DeleteDisk(ctx(t), d.ID)
	h.do(op, err)
	h.do(op, nil)
	if ids := h.listAll(0); len(ids) != 0 {
		t.Fatalf("ListDisks after delete = %v", ids)
	}
	// The name is free again, and a new disk gets a new ID.
	again := h.create("pvc-1", 2*gib)
	if again.ID == d.ID {
		t.Fatalf("recreated disk reuses the ID %s", d.ID)
	}
}

func testDeleteAttached(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	d := h.create("pvc-1", gib)
	h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a"))
	op, err := h.c.DeleteDisk(ctx(t), d.ID)
	h.refused("delete of an attached disk", op, err, cloud.ErrAttached)
	h.get(d.ID)
	h.do(h.c.DetachDisk(ctx(t), d.ID, "node-a"))
	h.do(h.c.DeleteDisk(ctx(t), d.ID))
	h.gone(d.ID)
}

// testDoneVisible: an operation reported Done has its effect visible to
// reads before anyone waits on it (csid then skips recording its id).
func testDoneVisible(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	d := h.create("pvc-1", gib)
	steps := []struct {
		name  string
		start func() (cloud.Operation, error)
		shows func(cloud.Disk) bool
	}{
		{"attach", func() (cloud.Operation, error) { return h.c.AttachDisk(ctx(t), d.ID, "node-a") }, func(d cloud.Disk) bool { return d.AttachedTo == "node-a" }},
		{"detach", func() (cloud.Operation, error) { return h.c.DetachDisk(ctx(t), d.ID, "node-a") }, func(d cloud.Disk) bool { return d.AttachedTo == "" }},
		{"resize", func() (cloud.Operation, error) { return h.c.ResizeDisk(ctx(t), d.ID, 2*gib) }, func(d cloud.Disk) bool { return d.SizeBytes >= 2*gib }},
	}
	for _, s := range steps {
		op, err := s.start()
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if op.Done && !s.shows(h.get(d.ID)) {
			t.Fatalf("%s reported Done, but GetDisk does not show it yet: %+v", s.name, h.get(d.ID))
		}
		if _, err := h.c.WaitOperation(ctx(t), op.ID); err != nil {
			t.Fatalf("wait %s: %v", s.name, err)
		}
	}
}

func testAttachDetachIdempotent(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	h.addNode(cloud.Node{ID: "node-b"})
	d := h.create("pvc-1", gib)
	for i := range 2 {
		if got := h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a")); got.AttachedTo != "node-a" {
			t.Fatalf("attach %d left %+v", i, got)
		}
	}
	if got := h.get(d.ID); got.AttachedTo != "node-a" {
		t.Fatalf("GetDisk after attach = %+v", got)
	}
	// Detaching from a node it is not attached to is success and changes
	// nothing.
	h.do(h.c.DetachDisk(ctx(t), d.ID, "node-b"))
	if got := h.get(d.ID); got.AttachedTo != "node-a" {
		t.Fatalf("detach from node-b detached it from node-a: %+v", got)
	}
	for i := range 2 {
		if got := h.do(h.c.DetachDisk(ctx(t), d.ID, "node-a")); got.AttachedTo != "" {
			t.Fatalf("detach %d left %+v", i, got)
		}
	}
	if got := h.get(d.ID); got.AttachedTo != "" {
		t.Fatalf("GetDisk after detach = %+v", got)
	}
}

func testSecondNode(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	h.addNode(cloud.Node{ID: "node-b"})
	d := h.create("pvc-1", gib)
	h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a"))
	op, err := h.c.AttachDisk(ctx(t), d.ID, "node-b")
	h.refused("attach to a second node", op, err, cloud.ErrAttached)
	if got := h.get(d.ID); got.AttachedTo != "node-a" {
		t.Fatalf("after the refused attach: %+v", got)
	}
	h.do(h.c.DetachDisk(ctx(t), d.ID, "node-a"))
	if got := h.do(h.c.AttachDisk(ctx(t), d.ID, "node-b")); got.AttachedTo != "node-b" {
		t.Fatalf("attach to node-b after detach: %+v", got)
	}
}

func testResizeOffline(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	d := h.create("pvc-1", gib)
	h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a"))
	op, err := h.c.ResizeDisk(ctx(t), d.ID, 2*gib)
	h.refused("resize of an attached disk", op, err, cloud.ErrAttached)
	if got := h.get(d.ID); got.SizeBytes != d.SizeBytes {
		t.Fatalf("the refused resize changed the size: %+v", got)
	}
	h.do(h.c.DetachDisk(ctx(t), d.ID, "node-a"))
	grown := h.do(h.c.ResizeDisk(ctx(t), d.ID, 2*gib))
	if grown.SizeBytes != 2*gib {
		t.Fatalf("resize to 2 GiB left %+v", grown)
	}
	if got := h.get(d.ID); got.SizeBytes != 2*gib {
		t.Fatalf("GetDisk after resize = %+v", got)
	}
	// The same size again, or a smaller one, is success and shrinks nothing.
	for _, size := range []int64{2 * gib, gib, 2*gib - 1} {
		if got := h.do(h.c.ResizeDisk(ctx(t), d.ID, size)); got.SizeBytes != 2*gib {
			t.Fatalf("resize to %d left %+v, want 2 GiB", size, got)
		}
	}
	for _, size := range []int64{0, -gib, h.c.MaxDiskBytes() + 1} {
		op, err := h.c.ResizeDisk(ctx(t), d.ID, size)
		h.refused(fmt.Sprintf("resize to %d", size), op, err, cloud.ErrInvalid)
	}
	// Grown while detached, it attaches again at the new size.
	if got := h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a")); got.SizeBytes != 2*gib {
		t.Fatalf("attach after resize: %+v", got)
	}
}

func testUpdateTags(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	created := h.do(h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib, Tags: map[string]string{"keep": "1", "change": "a"}}))
	id := created.ID
	want := map[string]string{"keep": "1", "change": "b", "added": "x"}
	// Set, change and add; the operation leaves the disk so, and so do its
	// repeats (the same operation again, or a new call).
	update := map[string]string{"change": "b", "added": "x"}
	for i := range 3 {
		got := h.do(h.c.UpdateDiskTags(ctx(t), id, update))
		if !maps.Equal(got.Tags, want) {
			t.Fatalf("update %d left tags %v, want %v", i, got.Tags, want)
		}
	}
	if got := h.get(id); !maps.Equal(got.Tags, want) || got.SizeBytes != gib {
		t.Fatalf("GetDisk after the update: %+v", got)
	}
	// An empty value removes a tag (also one that is not there); an
	// attached disk is tagged too.
	h.do(h.c.AttachDisk(ctx(t), id, "node-a"))
	got := h.do(h.c.UpdateDiskTags(ctx(t), id, map[string]string{"added": "", "never": ""}))
	delete(want, "added")
	if !maps.Equal(got.Tags, want) || got.AttachedTo != "node-a" {
		t.Fatalf("removing a tag of an attached disk left %+v", got)
	}
	if list := h.listAll(0); len(list) != 1 {
		t.Fatalf("list after tagging: %v", list)
	}
	page, err := h.c.ListDisks(ctx(t), cloud.ListOptions{})
	if err != nil || len(page.Disks) != 1 || !maps.Equal(page.Disks[0].Tags, want) {
		t.Fatalf("ListDisks after tagging: %+v, %v", page, err)
	}
	// The tags survive a restart of the client.
	if h.p.Reopen != nil {
		h.c = h.p.Reopen(t)
		if got := h.get(id); !maps.Equal(got.Tags, want) {
			t.Fatalf("tags after a restart: %v, want %v", got.Tags, want)
		}
	}
	op, err := h.c.UpdateDiskTags(ctx(t), id, map[string]string{"": "x"})
	h.refused("an empty tag name", op, err, cloud.ErrInvalid)
	gone := h.create("pvc-gone", gib)
	h.do(h.c.DeleteDisk(ctx(t), gone.ID))
	op, err = h.c.UpdateDiskTags(ctx(t), gone.ID, map[string]string{"a": "b"})
	h.refused("tags of an unknown disk", op, err, cloud.ErrNotFound)
	op, err = h.c.UpdateDiskTags(ctx(t), "../etc/passwd", map[string]string{"a": "b"})
	h.refused("tags of a malformed disk id", op, err, cloud.ErrInvalid)
}

func testListPaging(t *testing.T, h *harness) {
	var want []string
	for i := range 7 {
		want = append(want, h.create(fmt.Sprintf("pvc-%d", i), mib).ID)
	}
	slices.Sort(want)
	for _, size := range []int{0, 1, 2, 3, 7, 8, 100} {
		if got := h.listAll(size); !slices.Equal(got, want) {
			t.Fatalf("pages of %d: %v, want %v", size, got, want)
		}
	}
	// A token that names a disk deleted since: the listing goes on after it.
	page, err := h.c.ListDisks(ctx(t), cloud.ListOptions{MaxResults: 3})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Disks) != 3 || page.NextToken == "" {
		t.Fatalf("first page of 3: %+v", page)
	}
	last := page.Disks[2].ID
	h.do(h.c.DeleteDisk(ctx(t), last))
	rest := h.listFrom(cloud.ListOptions{PageToken: page.NextToken, MaxResults: 3})
	if !slices.Equal(rest, want[3:]) {
		t.Fatalf("after a deleted token: %v, want %v", rest, want[3:])
	}
	for _, bad := range []string{"garbage", "../etc/passwd", "disk-/x", want[0] + "x"} {
		_, err := h.c.ListDisks(ctx(t), cloud.ListOptions{PageToken: bad})
		if !errors.Is(err, cloud.ErrInvalid) {
			t.Errorf("ListDisks with token %q: %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := h.c.ListDisks(ctx(t), cloud.ListOptions{MaxResults: -1}); !errors.Is(err, cloud.ErrInvalid) {
		t.Errorf("ListDisks with MaxResults -1: %v, want ErrInvalid", err)
	}
}

func testOperationResume(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	create, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-1", SizeBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	if create.Kind != cloud.OpCreate || create.DiskID == "" {
		t.Fatalf("create operation = %+v", create)
	}
	// What csid persists is the operation; the client goes away with the
	// process.
	saved := create
	h.c = h.p.Reopen(t)
	d := h.do(saved, nil)
	if d.ID != saved.DiskID || d.Name != "pvc-1" {
		t.Fatalf("resumed create = %+v, want disk %s", d, saved.DiskID)
	}
	attach, err := h.c.AttachDisk(ctx(t), d.ID, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if attach.Kind != cloud.OpAttach || attach.DiskID != d.ID || attach.NodeID != "node-a" {
		t.Fatalf("attach operation = %+v", attach)
	}
	h.c = h.p.Reopen(t)
	if got := h.do(attach, nil); got.AttachedTo != "node-a" {
		t.Fatalf("resumed attach = %+v", got)
	}
	// Waiting again gives the same answer, even after a later change: the
	// disk as the operation left it.
	h.do(h.c.DetachDisk(ctx(t), d.ID, "node-a"))
	if got := h.do(attach, nil); got.AttachedTo != "node-a" {
		t.Fatalf("second wait on the attach = %+v", got)
	}
	if _, err := h.c.WaitOperation(ctx(t), "op-0000000000000000ffffffff"); !errors.Is(err, cloud.ErrNotFound) {
		t.Errorf("wait on an unknown operation: %v, want ErrNotFound", err)
	}
	for _, bad := range []string{"", "../ops/x", "op-1/../../x", "not-an-op"} {
		if _, err := h.c.WaitOperation(ctx(t), bad); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("wait on operation %q: %v, want ErrNotFound", bad, err)
		}
	}
}

func testAttachLimit(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a", MaxAttachments: 2})
	var disks []cloud.Disk
	for i := range 3 {
		disks = append(disks, h.create(fmt.Sprintf("pvc-%d", i), mib))
	}
	h.do(h.c.AttachDisk(ctx(t), disks[0].ID, "node-a"))
	h.do(h.c.AttachDisk(ctx(t), disks[1].ID, "node-a"))
	// Re-attaching what is attached takes no slot.
	h.do(h.c.AttachDisk(ctx(t), disks[1].ID, "node-a"))
	op, err := h.c.AttachDisk(ctx(t), disks[2].ID, "node-a")
	h.refused("attach beyond the limit", op, err, cloud.ErrLimitReached)
	if got := h.get(disks[2].ID); got.AttachedTo != "" {
		t.Fatalf("refused attach attached: %+v", got)
	}
	h.do(h.c.DetachDisk(ctx(t), disks[0].ID, "node-a"))
	h.do(h.c.AttachDisk(ctx(t), disks[2].ID, "node-a"))
}

func testUnknown(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a"})
	d := h.create("pvc-1", gib)
	gone := h.create("pvc-gone", gib)
	h.do(h.c.DeleteDisk(ctx(t), gone.ID))

	if _, err := h.c.GetNode(ctx(t), "node-x"); !errors.Is(err, cloud.ErrNotFound) {
		t.Errorf("GetNode of an unknown node: %v, want ErrNotFound", err)
	}
	op, err := h.c.AttachDisk(ctx(t), d.ID, "node-x")
	h.refused("attach to an unknown node", op, err, cloud.ErrNotFound)
	op, err = h.c.AttachDisk(ctx(t), gone.ID, "node-a")
	h.refused("attach of an unknown disk", op, err, cloud.ErrNotFound)
	op, err = h.c.ResizeDisk(ctx(t), gone.ID, 2*gib)
	h.refused("resize of an unknown disk", op, err, cloud.ErrNotFound)
	h.gone(gone.ID)
	// Undoing what does not exist is success.
	h.do(h.c.DetachDisk(ctx(t), gone.ID, "node-a"))
	h.do(h.c.DeleteDisk(ctx(t), gone.ID))

	// Ids that are not the provider's are never looked up.
	for _, bad := range []string{"", "disk", "../" + d.ID, d.ID + "/..", "/etc/passwd", d.ID + "0", "disk-" + strings.Repeat("a", 124), string(make([]byte, 200))} {
		if _, err := h.c.GetDisk(ctx(t), bad); !errors.Is(err, cloud.ErrNotFound) {
			t.Errorf("GetDisk(%q): %v, want ErrNotFound", bad, err)
		}
		calls := map[string]func() (cloud.Operation, error){
			"DeleteDisk": func() (cloud.Operation, error) { return h.c.DeleteDisk(ctx(t), bad) },
			"AttachDisk": func() (cloud.Operation, error) { return h.c.AttachDisk(ctx(t), bad, "node-a") },
			"DetachDisk": func() (cloud.Operation, error) { return h.c.DetachDisk(ctx(t), bad, "node-a") },
			"ResizeDisk": func() (cloud.Operation, error) { return h.c.ResizeDisk(ctx(t), bad, gib) },
		}
		for name, call := range calls {
			op, err := call()
			h.refused(fmt.Sprintf("%s(%q)", name, bad), op, err, cloud.ErrInvalid)
		}
	}
	if got := h.get(d.ID); got.AttachedTo != "" || got.SizeBytes != d.SizeBytes {
		t.Fatalf("refused calls changed %+v", got)
	}
}

func testCapacity(t *testing.T, h *harness) {
	free, err := h.c.Capacity(ctx(t), "")
	if err != nil || free <= 0 {
		t.Fatalf("Capacity of the default zone = %d, %v", free, err)
	}
	for _, z := range h.c.Zones() {
		if _, err := h.c.Capacity(ctx(t), z); err != nil {
			t.Errorf("Capacity(%q): %v", z, err)
		}
	}
	if _, err := h.c.Capacity(ctx(t), "no-such-zone"); !errors.Is(err, cloud.ErrInvalid) {
		t.Errorf("Capacity of an unknown zone: %v, want ErrInvalid", err)
	}
	tooBig := (free/gib + 1) * gib
	if tooBig > 4<<40 {
		t.Logf("%d bytes free: not checking a disk larger than the capacity", free)
		return
	}
	op, err := h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-huge", SizeBytes: tooBig})
	h.refused("create beyond the capacity", op, err, cloud.ErrLimitReached)
}

func testNodes(t *testing.T, h *harness) {
	h.addNode(cloud.Node{ID: "node-a", MaxAttachments: 3})
	n, err := h.c.GetNode(ctx(t), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	want := func(limit int) int {
		if h.p.MaxAttachments > 0 {
			return h.p.MaxAttachments
		}
		return limit
	}
	if n.ID != "node-a" || n.MaxAttachments != want(3) {
		t.Fatalf("GetNode = %+v, want %d attachments", n, want(3))
	}
	if zones := h.c.Zones(); len(zones) > 0 && n.Zone != zones[0] {
		t.Errorf("node zone = %q, want the default %q", n.Zone, zones[0])
	}
	// Registering again updates the node.
	h.addNode(cloud.Node{ID: "node-a", MaxAttachments: 5})
	if n, err := h.c.GetNode(ctx(t), "node-a"); err != nil || n.MaxAttachments != want(5) {
		t.Fatalf("after re-registering: %+v, %v", n, err)
	}
}

func testHost(t *testing.T, h *harness) {
	if h.p.Host == nil {
		t.Skip("the provider has no host to test")
	}
	if h.p.HostNeedsRoot {
		testutil.RequireRoot(t)
	}
	h.addNode(cloud.Node{ID: "node-a"})
	h.addNode(cloud.Node{ID: "node-b"})
	d := h.do(h.c.CreateDisk(ctx(t), cloud.DiskSpec{Name: "pvc-1", SizeBytes: 16 * mib, Tags: map[string]string{"owner": "pvc-1"}}))
	hostA := h.p.Host(t, "node-a")
	hostB := h.p.Host(t, "node-b")
	if hostA.NodeID() != "node-a" {
		t.Fatalf("NodeID = %q", hostA.NodeID())
	}
	if _, err := hostA.OpenDevice(ctx(t), d.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("OpenDevice of a detached disk: %v, want ErrNotFound", err)
	}
	h.do(h.c.AttachDisk(ctx(t), d.ID, "node-a"))
	var opened []*cloud.Device
	defer func() {
		for _, dev := range opened {
			dev.Close()
		}
	}()
	open := func(id string, opts cloud.OpenOptions) *cloud.Device {
		t.Helper()
		dev, err := hostA.OpenDevice(ctx(t), id, opts)
		if err != nil || dev.Path == "" || dev.Disk.ID != id || dev.Disk.AttachedTo != "node-a" {
			t.Fatalf("OpenDevice(%s) = %+v, %v", id, dev, err)
		}
		opened = append(opened, dev)
		return dev
	}
	first := open(d.ID, cloud.OpenOptions{})
	if first.Disk.Tags["owner"] != "pvc-1" {
		t.Fatalf("the device's disk has tags %v, want the disk's", first.Disk.Tags)
	}
	dev := first.Path
	if again := open(d.ID, cloud.OpenOptions{Hint: dev}); again.Path != dev || again.Number != first.Number {
		t.Fatalf("second OpenDevice = %s (%d); want %s (%d)", again.Path, again.Number, dev, first.Number)
	}
	// A hint that names another disk's device proves not to be this one:
	// the disk's own device is opened instead.
	d2 := h.create("pvc-2", 16*mib)
	h.do(h.c.AttachDisk(ctx(t), d2.ID, "node-a"))
	if other := open(d2.ID, cloud.OpenOptions{Hint: dev}); other.Path == dev || other.Number == first.Number {
		t.Fatalf("OpenDevice of %s with %s's device as a hint opened %s", d2.ID, d.ID, other.Path)
	}
	if _, err := hostB.OpenDevice(ctx(t), d.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("OpenDevice on the other node: %v, want ErrNotFound", err)
	}
	devs, err := hostA.Devices(ctx(t))
	if err != nil || devs[d.ID] != dev {
		t.Fatalf("Devices = %v, %v; want %s at %s", devs, err, d.ID, dev)
	}
	// A detach releases the device once it is closed.
	for _, dev := range opened {
		if err := dev.Close(); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{d.ID, d2.ID} {
		h.do(h.c.DetachDisk(ctx(t), id, "node-a"))
	}
	if _, err := hostA.OpenDevice(ctx(t), d.ID, cloud.OpenOptions{}); !errors.Is(err, cloud.ErrNotFound) {
		t.Fatalf("OpenDevice after detach: %v, want ErrNotFound", err)
	}
	if devs, err := hostA.Devices(ctx(t)); err != nil || len(devs) != 0 {
		t.Fatalf("Devices after detach = %v, %v; want none", devs, err)
	}
}
