package yandexfake_test

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func TestDiskLifecycle(t *testing.T) {
	c := start(t, yandexfake.Options{})
	op, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "pv-1",
		ZoneId: "ru-central1-a", Size: 2 << 30, TypeId: "network-ssd", Labels: map[string]string{"csid": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	if op.Done {
		t.Fatal("Create answered a done operation; the API's are asynchronous")
	}
	var meta compute.CreateDiskMetadata
	if err := op.Metadata.UnmarshalTo(&meta); err != nil || meta.DiskId == "" {
		t.Fatalf("create metadata: %v %v", meta.DiskId, err)
	}
	if len(meta.DiskId) != 20 {
		t.Errorf("disk id %q: want 20 characters like the API's", meta.DiskId)
	}
	var d compute.Disk
	c.response(t, op, &d)
	if d.Id != meta.DiskId || d.Status != compute.Disk_READY || d.Size != 2<<30 || d.TypeId != "network-ssd" || d.Labels["csid"] != "yes" {
		t.Fatalf("created disk: %v", &d)
	}
	got, err := c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: d.Id})
	if err != nil || got.Name != "pv-1" {
		t.Fatalf("Get: %v %v", got, err)
	}

	_, err = c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "pv-1", ZoneId: "ru-central1-a", Size: 1 << 30})
	wantCode(t, "create with a name taken", err, codes.AlreadyExists)

	op, err = c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size", "labels"}},
		Size: 3 << 30, Labels: map[string]string{"other": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	c.response(t, op, &d)
	if d.Size != 3<<30 || len(d.Labels) != 1 || d.Labels["other"] != "x" {
		t.Fatalf("updated disk: %v", &d)
	}

	op, err = c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	if err != nil {
		t.Fatal(err)
	}
	done := c.wait(t, op)
	if done.GetError() != nil || !done.GetResponse().MessageIs(&emptypb.Empty{}) {
		t.Fatalf("delete: %v", done.Result)
	}
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: d.Id})
	wantCode(t, "get of a deleted disk", err, codes.NotFound)
}

func TestCreateValidation(t *testing.T) {
	c := start(t, yandexfake.Options{})
	folder := c.fake.FolderID()
	for _, tc := range []struct {
		name string
		req  *compute.CreateDiskRequest
		want codes.Code
	}{
		{"unknown zone", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "mars-1", Size: 1 << 30}, codes.InvalidArgument},
		{"unknown type", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", TypeId: "floppy", Size: 1 << 30}, codes.InvalidArgument},
		{"bad name", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Name: "Upper", Size: 1 << 30}, codes.InvalidArgument},
		{"bad label key", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Size: 1 << 30, Labels: map[string]string{"Csid": "x"}}, codes.InvalidArgument},
		{"bad label value", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Size: 1 << 30, Labels: map[string]string{"csid": "A B"}}, codes.InvalidArgument},
		{"too small", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Size: 1 << 20}, codes.InvalidArgument},
		{"too large", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Size: yandexfake.MaxDiskBytes + 1}, codes.InvalidArgument},
		{"nonreplicated not 93 GiB", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", TypeId: "network-ssd-nonreplicated", Size: 1 << 30}, codes.InvalidArgument},
		{"other folder", &compute.CreateDiskRequest{FolderId: "b1gother", ZoneId: "ru-central1-a", Size: 1 << 30}, codes.PermissionDenied},
		{"from an image", &compute.CreateDiskRequest{FolderId: folder, ZoneId: "ru-central1-a", Size: 1 << 30, Source: &compute.CreateDiskRequest_ImageId{ImageId: "fd8x"}}, codes.Unimplemented},
	} {
		_, err := c.disks.Create(c.ctx, tc.req)
		wantCode(t, tc.name, err, tc.want)
	}
	list, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: folder})
	if err != nil || len(list.Disks) != 0 {
		t.Fatalf("refused creates left disks: %v %v", list, err)
	}
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: strings.Repeat("x", 51)})
	wantCode(t, "get of an over-long id", err, codes.InvalidArgument)
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: "fhmnosuchdisk0000000"})
	wantCode(t, "get of an unknown id", err, codes.NotFound)
}

// quotaSubject returns the subject of the QuotaFailure detail of err, or
// "" when it has none.
func quotaSubject(err error) string {
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok && len(q.Violations) > 0 {
			return q.Violations[0].Subject
		}
	}
	return ""
}

func TestQuota(t *testing.T) {
	c := start(t, yandexfake.Options{Quota: yandexfake.Quota{Disks: 2, Bytes: 5 << 30}})
	a := c.createDisk(t, &compute.CreateDiskRequest{Size: 2 << 30})
	c.createDisk(t, &compute.CreateDiskRequest{Size: 2 << 30})
	_, err := c.disks.Create(c.ctx, &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), ZoneId: "ru-central1-a", Size: 1 << 30})
	wantCode(t, "a third disk", err, codes.ResourceExhausted)
	if s := quotaSubject(err); s != yandexfake.QuotaDiskCount {
		t.Fatalf("quota subject %q, want %q", s, yandexfake.QuotaDiskCount)
	}
	_, err = c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: a.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size"}}, Size: 4 << 30})
	wantCode(t, "a grow beyond the bytes", err, codes.ResourceExhausted)
	if s := quotaSubject(err); s != yandexfake.QuotaDiskBytes {
		t.Fatalf("quota subject %q, want %q", s, yandexfake.QuotaDiskBytes)
	}
	c.fake.SetQuota(yandexfake.Quota{})
	c.createDisk(t, &compute.CreateDiskRequest{Size: 8 << 30})
}

func TestListFilterAndPages(t *testing.T) {
	c := start(t, yandexfake.Options{})
	// Ids grow with each disk created: the listing's order is this one.
	for i, v := range []string{"a", "b", "a", "c", "a"} {
		c.createDisk(t, &compute.CreateDiskRequest{Name: fmt.Sprintf("d-%d", i), Labels: map[string]string{"k": v, "csid.io/v": "1"}})
	}
	c.createDisk(t, &compute.CreateDiskRequest{Name: "bare"})
	names := func(filter string, pageSize int64) []string {
		t.Helper()
		var out []string
		tok := ""
		for {
			resp, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID(), Filter: filter, PageSize: pageSize, PageToken: tok})
			if err != nil {
				t.Fatalf("List(%q): %v", filter, err)
			}
			if pageSize > 0 && len(resp.Disks) > int(pageSize) {
				t.Fatalf("page of %d disks, asked for %d", len(resp.Disks), pageSize)
			}
			for _, d := range resp.Disks {
				out = append(out, d.Name)
			}
			if tok = resp.NextPageToken; tok == "" {
				return out
			}
		}
	}
	for _, tc := range []struct {
		filter string
		want   string
	}{
		{``, "d-0 d-1 d-2 d-3 d-4 bare"},
		{`name = "d-1"`, "d-1"},
		{`name='d-1'`, "d-1"},
		{`labels.k = "a"`, "d-0 d-2 d-4"},
		{`labels.k="a" AND name != "d-2"`, "d-0 d-4"},
		{`labels.k IN ("b", "c")`, "d-1 d-3"},
		{`labels.k NOT IN ("a")`, "d-1 d-3 bare"},
		{`labels.csid.io/v = "1" and labels.k = 'c'`, "d-3"},
		{`labels.missing = ""`, ""},
	} {
		if got := strings.Join(names(tc.filter, 2), " "); got != tc.want {
			t.Errorf("filter %q: %q, want %q", tc.filter, got, tc.want)
		}
	}
	for _, bad := range []string{`size > 3`, `name = d-1`, `name = "d-1" OR name = "d-2"`, `name = "x" AND`, `labels.K = "a"`, `name IN "a"`, `name = "unterminated`} {
		_, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID(), Filter: bad})
		wantCode(t, "filter "+bad, err, codes.InvalidArgument)
	}
	_, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID(), PageToken: "garbage!"})
	wantCode(t, "a malformed page token", err, codes.InvalidArgument)
	_, err = c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID(), PageSize: 1001})
	wantCode(t, "a page too large", err, codes.InvalidArgument)
}

func TestUpdateRules(t *testing.T) {
	c := start(t, yandexfake.Options{})
	if err := c.fake.AddInstance("vm-1", "ru-central1-a", 0); err != nil {
		t.Fatal(err)
	}
	d := c.createDisk(t, &compute.CreateDiskRequest{Size: 2 << 30})
	update := func(paths []string, size int64) error {
		op, err := c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: paths}, Size: size})
		if err == nil {
			c.response(t, op, d)
		}
		return err
	}
	wantCode(t, "no mask", update(nil, 3<<30), codes.InvalidArgument)
	wantCode(t, "a path the fake does not update", update([]string{"type_id"}, 3<<30), codes.InvalidArgument)
	wantCode(t, "a shrink", update([]string{"size"}, 1<<30), codes.InvalidArgument)
	wantCode(t, "beyond the update limit", update([]string{"size"}, yandexfake.MaxUpdateDiskBytes+1), codes.InvalidArgument)
	c.attach(t, "vm-1", d.Id)
	wantCode(t, "a grow of an attached disk", update([]string{"size"}, 3<<30), codes.FailedPrecondition)
	op, err := c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}}, Labels: map[string]string{"x": "y"}})
	if err != nil {
		t.Fatalf("labels of an attached disk: %v", err)
	}
	c.response(t, op, d)
	c.fake.SetGrowAttached(true)
	wantCode(t, "a grow of an attached disk that may grow online", update([]string{"size"}, 3<<30), codes.OK)
	if d.Size != 3<<30 {
		t.Fatalf("size %d after an online grow", d.Size)
	}
	c.fake.SetGrowAttached(false)
	c.detach(t, "vm-1", d.Id)
	wantCode(t, "a grow of a detached disk", update([]string{"size"}, 4<<30), codes.OK)
	if d.Size != 4<<30 || d.Labels["x"] != "y" {
		t.Fatalf("disk after the grow: %v", d)
	}
}

func TestDeleteAttached(t *testing.T) {
	c := start(t, yandexfake.Options{})
	if err := c.fake.AddInstance("vm-1", "ru-central1-a", 0); err != nil {
		t.Fatal(err)
	}
	d := c.createDisk(t, &compute.CreateDiskRequest{})
	c.attach(t, "vm-1", d.Id)
	_, err := c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	wantCode(t, "delete of an attached disk", err, codes.FailedPrecondition)
	c.detach(t, "vm-1", d.Id)
	op, err := c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, op)
	_, err = c.disks.Delete(c.ctx, &compute.DeleteDiskRequest{DiskId: d.Id})
	wantCode(t, "delete of a deleted disk", err, codes.NotFound)
}

func TestDiskOperations(t *testing.T) {
	c := start(t, yandexfake.Options{})
	d := c.createDisk(t, &compute.CreateDiskRequest{})
	// Another disk's operation, between d's two, is not d's.
	c.createDisk(t, &compute.CreateDiskRequest{})
	op, err := c.disks.Update(c.ctx, &compute.UpdateDiskRequest{DiskId: d.Id, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"size"}}, Size: 2 << 30})
	if err != nil {
		t.Fatal(err)
	}
	c.wait(t, op)
	resp, err := c.disks.ListOperations(c.ctx, &compute.ListDiskOperationsRequest{DiskId: d.Id})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Operations) != 2 || resp.Operations[0].Description != "Create disk" || resp.Operations[1].Id != op.Id {
		t.Fatalf("operations of the disk: %v", resp.Operations)
	}
	// The same, a page of one at a time.
	var ids []string
	for tok := ""; ; {
		page, err := c.disks.ListOperations(c.ctx, &compute.ListDiskOperationsRequest{DiskId: d.Id, PageSize: 1, PageToken: tok})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Operations) != 1 {
			t.Fatalf("a page of %d operations, asked for 1", len(page.Operations))
		}
		ids = append(ids, page.Operations[0].Id)
		if tok = page.NextPageToken; tok == "" {
			break
		}
	}
	if len(ids) != 2 || ids[0] != resp.Operations[0].Id || ids[1] != op.Id {
		t.Fatalf("operations of the disk page by page: %v", ids)
	}
}
