package yandexfake_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	ycsdk "github.com/yandex-cloud/go-sdk"
	"github.com/yandex-cloud/go-sdk/iamkey"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// TestSDK drives the fake through the vendor's SDK as csid's backend does:
// endpoint discovery, the key file's JWT exchanged for an IAM token, a
// disk created and waited for with the SDK's operation helper.
func TestSDK(t *testing.T) {
	f, ctx := startFake(t, yandexfake.Options{})
	path := filepath.Join(t.TempDir(), "key.json")
	if _, err := f.WriteServiceAccountKey(path); err != nil {
		t.Fatal(err)
	}
	key, err := iamkey.ReadFromJSONFile(path)
	if err != nil {
		t.Fatalf("the SDK cannot read the key file the fake issued: %v", err)
	}
	creds, err := ycsdk.ServiceAccountKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sdk, err := ycsdk.Build(ctx, ycsdk.Config{Credentials: creds, Endpoint: f.Endpoint(), Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Shutdown(context.Background())

	op, err := sdk.WrapOperation(sdk.Compute().Disk().Create(ctx, &compute.CreateDiskRequest{
		FolderId: f.FolderID(), Name: "sdk-disk", ZoneId: f.Zones()[0], Size: 1 << 30}))
	if err != nil {
		t.Fatalf("Create through the SDK: %v", err)
	}
	if err := op.Wait(ctx); err != nil {
		t.Fatalf("waiting through the SDK: %v", err)
	}
	resp, err := op.Response()
	if err != nil {
		t.Fatal(err)
	}
	d := resp.(*compute.Disk)
	if d.Name != "sdk-disk" || d.Status != compute.Disk_READY {
		t.Fatalf("disk: %v", d)
	}
	got, err := sdk.Compute().Disk().Get(ctx, &compute.GetDiskRequest{DiskId: d.Id})
	if err != nil || got.Id != d.Id {
		t.Fatalf("Get through the SDK: %v %v", got, err)
	}
	// The SDK sent the key's JWT once and the token on the compute calls.
	var exchanges, bearer int
	for _, r := range f.Seen() {
		switch {
		case r.Method == yandexfake.MethodIAMTokenCreate:
			exchanges++
		case len(r.Metadata.Get("authorization")) == 1:
			bearer++
		}
	}
	if exchanges != 1 || bearer == 0 {
		t.Fatalf("token exchanges %d, calls with a token %d", exchanges, bearer)
	}
}

// TestSDKInstanceServiceAccount: the SDK's instance credentials take their
// token from the fake metadata service (YC_METADATA_ADDR) and the API
// accepts it.
func TestSDKInstanceServiceAccount(t *testing.T) {
	f, ctx := startFake(t, yandexfake.Options{})
	md := f.MetadataServer("vm-1", "ru-central1-a", f.FolderID())
	t.Setenv(ycsdk.InstanceMetadataOverrideEnvVar, strings.TrimPrefix(md.URL, "http://"))
	sdk, err := ycsdk.Build(ctx, ycsdk.Config{Credentials: ycsdk.InstanceServiceAccount(), Endpoint: f.Endpoint(), Plaintext: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Shutdown(context.Background())
	zones, err := sdk.Compute().Zone().List(ctx, &compute.ListZonesRequest{})
	if err != nil || len(zones.Zones) != len(f.Zones()) {
		t.Fatalf("zones through the SDK with the instance's token: %v %v", zones, err)
	}
}
