package yandexfake_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	iam "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/operation"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// client is the generated clients of one connection to a fake, with a
// token in every call's context (ctx).
type client struct {
	fake  *yandexfake.Fake
	conn  *grpc.ClientConn
	ctx   context.Context
	disks compute.DiskServiceClient
	inst  compute.InstanceServiceClient
	zones compute.ZoneServiceClient
	ops   operation.OperationServiceClient
	iam   iam.IamTokenServiceClient
}

// startFake starts a fake that the test's end closes, and returns it with
// the test's context (a minute).
func startFake(t *testing.T, opts yandexfake.Options) (*yandexfake.Fake, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	f, err := yandexfake.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f, ctx
}

// start starts a fake and connects to it with a token from a key it
// issued.
func start(t *testing.T, opts yandexfake.Options) *client {
	t.Helper()
	f, ctx := startFake(t, opts)
	conn, err := grpc.NewClient(f.Endpoint(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c := &client{
		fake: f, conn: conn, ctx: ctx,
		disks: compute.NewDiskServiceClient(conn),
		inst:  compute.NewInstanceServiceClient(conn),
		zones: compute.NewZoneServiceClient(conn),
		ops:   operation.NewOperationServiceClient(conn),
		iam:   iam.NewIamTokenServiceClient(conn),
	}
	key := newKey(t, f)
	resp, err := c.iam.Create(ctx, &iam.CreateIamTokenRequest{Identity: &iam.CreateIamTokenRequest_Jwt{Jwt: key.jwt(t, jwtOpts{})}})
	if err != nil {
		t.Fatalf("IamTokenService.Create: %v", err)
	}
	c.ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+resp.IamToken)
	return c
}

// key is a parsed service-account key file.
type key struct {
	file yandexfake.KeyFile
	priv *rsa.PrivateKey
}

func newKey(t *testing.T, f *yandexfake.Fake) key {
	t.Helper()
	raw, err := f.NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	var k key
	if err := json.Unmarshal(raw, &k.file); err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(k.file.PrivateKey))
	if block == nil {
		t.Fatal("no PEM block in the key file's private_key")
	}
	p, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	k.priv = p.(*rsa.PrivateKey)
	return k
}

// jwtOpts spoil a JWT for the tests of the checks.
type jwtOpts struct {
	alg, kid, iss, aud string
	iat, exp           time.Time
	signer             *rsa.PrivateKey
}

// jwt signs a JWT as the Yandex SDK does (PS256, salt length = hash).
func (k key) jwt(t *testing.T, o jwtOpts) string {
	t.Helper()
	now := time.Now()
	if o.alg == "" {
		o.alg = "PS256"
	}
	if o.kid == "" {
		o.kid = k.file.ID
	}
	if o.iss == "" {
		o.iss = k.file.ServiceAccountID
	}
	if o.aud == "" {
		o.aud = yandexfake.TokenAudience
	}
	if o.iat.IsZero() {
		o.iat = now
	}
	if o.exp.IsZero() {
		o.exp = now.Add(time.Hour)
	}
	if o.signer == nil {
		o.signer = k.priv
	}
	enc := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	signed := enc(map[string]string{"alg": o.alg, "typ": "JWT", "kid": o.kid}) + "." +
		enc(map[string]any{"iss": o.iss, "aud": []string{o.aud}, "iat": o.iat.Unix(), "exp": o.exp.Unix()})
	digest := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPSS(rand.Reader, o.signer, crypto.SHA256, digest[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
	if err != nil {
		t.Fatal(err)
	}
	return signed + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// wait polls an operation until it is done (as a client does) and returns
// it; the test fails if it does not finish in time.
func (c *client) wait(t *testing.T, op *operation.Operation) *operation.Operation {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := c.ops.Get(c.ctx, &operation.GetOperationRequest{OperationId: op.Id})
		if err != nil {
			t.Fatalf("OperationService.Get(%s): %v", op.Id, err)
		}
		if got.Done {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("operation %s (%s) not done after 30s", op.Id, op.Description)
		}
		time.Sleep(time.Millisecond)
	}
}

// response waits for op and unmarshals its response into m.
func (c *client) response(t *testing.T, op *operation.Operation, m proto.Message) {
	t.Helper()
	done := c.wait(t, op)
	if e := done.GetError(); e != nil {
		t.Fatalf("operation %s (%s) failed: %v", op.Id, op.Description, e)
	}
	if err := done.GetResponse().UnmarshalTo(m); err != nil {
		t.Fatal(err)
	}
}

// createDisk creates a disk and waits for it.
func (c *client) createDisk(t *testing.T, req *compute.CreateDiskRequest) *compute.Disk {
	t.Helper()
	if req.FolderId == "" {
		req.FolderId = c.fake.FolderID()
	}
	if req.ZoneId == "" {
		req.ZoneId = c.fake.Zones()[0]
	}
	if req.Size == 0 {
		req.Size = 1 << 30
	}
	op, err := c.disks.Create(c.ctx, req)
	if err != nil {
		t.Fatalf("DiskService.Create(%s): %v", req.Name, err)
	}
	var d compute.Disk
	c.response(t, op, &d)
	return &d
}

func (c *client) attach(t *testing.T, instanceID, diskID string) *compute.Instance {
	t.Helper()
	op, err := c.inst.AttachDisk(c.ctx, &compute.AttachInstanceDiskRequest{InstanceId: instanceID,
		AttachedDiskSpec: &compute.AttachedDiskSpec{DeviceName: diskID, Disk: &compute.AttachedDiskSpec_DiskId{DiskId: diskID}}})
	if err != nil {
		t.Fatalf("AttachDisk(%s, %s): %v", instanceID, diskID, err)
	}
	var in compute.Instance
	c.response(t, op, &in)
	return &in
}

func (c *client) detach(t *testing.T, instanceID, diskID string) *compute.Instance {
	t.Helper()
	op, err := c.inst.DetachDisk(c.ctx, &compute.DetachInstanceDiskRequest{InstanceId: instanceID,
		Disk: &compute.DetachInstanceDiskRequest_DiskId{DiskId: diskID}})
	if err != nil {
		t.Fatalf("DetachDisk(%s, %s): %v", instanceID, diskID, err)
	}
	var in compute.Instance
	c.response(t, op, &in)
	return &in
}

// wantCode fails the test unless err has code want.
func wantCode(t *testing.T, what string, err error, want codes.Code) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: code %v (%v), want %v", what, got, err, want)
	}
}
