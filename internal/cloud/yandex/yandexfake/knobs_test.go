package yandexfake_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func TestLatency(t *testing.T) {
	c := start(t, yandexfake.Options{})
	const d = 100 * time.Millisecond
	c.fake.SetLatency(yandexfake.MethodZoneList, d)
	began := time.Now()
	if _, err := c.zones.List(c.ctx, &compute.ListZonesRequest{}); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(began); took < d {
		t.Fatalf("a call with latency %v took %v", d, took)
	}
	ctx, cancel := context.WithTimeout(c.ctx, d/4)
	defer cancel()
	_, err := c.zones.List(ctx, &compute.ListZonesRequest{})
	wantCode(t, "a deadline shorter than the latency", err, codes.DeadlineExceeded)
	c.fake.SetLatency(yandexfake.MethodZoneList, 0)
	ctx, cancel = context.WithTimeout(c.ctx, d/4)
	defer cancel()
	if _, err := c.zones.List(ctx, &compute.ListZonesRequest{}); err != nil {
		t.Fatalf("latency removed: %v", err)
	}
}

func TestFailCalls(t *testing.T) {
	c := start(t, yandexfake.Options{})
	c.fake.FailCalls(yandexfake.MethodDiskCreate, codes.Unavailable, 2)
	req := &compute.CreateDiskRequest{FolderId: c.fake.FolderID(), Name: "x", ZoneId: "ru-central1-a", Size: 1 << 30}
	for i := range 2 {
		_, err := c.disks.Create(c.ctx, req)
		wantCode(t, "an injected failure", err, codes.Unavailable)
		if i == 0 {
			list, err := c.disks.List(c.ctx, &compute.ListDisksRequest{FolderId: c.fake.FolderID()})
			if err != nil || len(list.Disks) != 0 {
				t.Fatalf("a failed call made a disk: %v %v", list, err)
			}
		}
	}
	if _, err := c.disks.Create(c.ctx, req); err != nil {
		t.Fatalf("after the failures: %v", err)
	}
	// A call without a token is refused before a failure is spent.
	c.fake.FailCalls(yandexfake.MethodZoneList, codes.Internal, 1)
	_, err := c.zones.List(context.Background(), &compute.ListZonesRequest{})
	wantCode(t, "no token", err, codes.Unauthenticated)
	_, err = c.zones.List(c.ctx, &compute.ListZonesRequest{})
	wantCode(t, "the failure", err, codes.Internal)
}

func TestThrottleCalls(t *testing.T) {
	c := start(t, yandexfake.Options{})
	c.fake.Throttle(yandexfake.Throttling{Calls: 3})
	list := func() error {
		_, err := c.zones.List(c.ctx, &compute.ListZonesRequest{})
		return err
	}
	for range 3 {
		err := list()
		wantCode(t, "a throttled call", err, codes.ResourceExhausted)
		if s := quotaSubject(err); s != "" {
			t.Fatalf("throttling carries a quota detail %q; it must not look like a quota", s)
		}
	}
	wantCode(t, "after the throttled calls", list(), codes.OK)
	if n := len(c.fake.Calls(yandexfake.MethodZoneList)); n != 4 {
		t.Fatalf("Calls: %d, want 4 (throttled calls count)", n)
	}

	c.fake.Throttle(yandexfake.Throttling{Method: yandexfake.MethodDiskGet, Code: codes.Unavailable})
	_, err := c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: "fhmnosuchdisk0000000"})
	wantCode(t, "a throttled method", err, codes.Unavailable)
	wantCode(t, "another method", list(), codes.OK)
	c.fake.Unthrottle()
	_, err = c.disks.Get(c.ctx, &compute.GetDiskRequest{DiskId: "fhmnosuchdisk0000000"})
	wantCode(t, "unthrottled", err, codes.NotFound)
}

func TestThrottleFor(t *testing.T) {
	c := start(t, yandexfake.Options{})
	const d = 200 * time.Millisecond
	began := time.Now()
	c.fake.Throttle(yandexfake.Throttling{For: d})
	var refused int
	for {
		_, err := c.zones.List(c.ctx, &compute.ListZonesRequest{})
		if err == nil {
			break
		}
		wantCode(t, "a call while throttled", err, codes.ResourceExhausted)
		refused++
		time.Sleep(10 * time.Millisecond)
	}
	if took := time.Since(began); took < d || refused == 0 {
		t.Fatalf("throttled for %v (%d calls refused), want %v", took, refused, d)
	}
	// Endpoint discovery and IAM are not throttled by a Throttling of all.
	c.fake.Throttle(yandexfake.Throttling{})
	k := newKey(t, c.fake)
	if _, err := c.iam.Create(c.ctx, iamReq(k.jwt(t, jwtOpts{}))); err != nil {
		t.Fatalf("IAM under a throttling of the API: %v", err)
	}
}

func TestSeen(t *testing.T) {
	c := start(t, yandexfake.Options{})
	c.createDisk(t, &compute.CreateDiskRequest{Name: "seen-disk", Labels: map[string]string{"who": "me"}})
	var create *yandexfake.Request
	seen := c.fake.Seen()
	for i := range seen {
		if seen[i].Method == yandexfake.MethodDiskCreate {
			create = &seen[i]
		}
	}
	if create == nil {
		t.Fatal("Seen has no DiskService/Create")
	}
	if auth := create.Metadata.Get("authorization"); len(auth) != 1 || !strings.HasPrefix(auth[0], "Bearer t1.") {
		t.Fatalf("metadata seen: %v", create.Metadata)
	}
	if !strings.Contains(string(create.Body), "seen-disk") || !strings.Contains(string(create.Body), `"who"`) {
		t.Fatalf("body seen: %s", create.Body)
	}
	if seen[0].Method != yandexfake.MethodIAMTokenCreate || !strings.Contains(string(seen[0].Body), "jwt") {
		t.Fatalf("first request seen: %s %s", seen[0].Method, seen[0].Body)
	}
	if len(c.fake.Calls("")) != len(seen) {
		t.Fatalf("Calls(\"\") has %d calls, Seen %d", len(c.fake.Calls("")), len(seen))
	}
}
