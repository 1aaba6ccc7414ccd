package yandexfake_test

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/yandex-cloud/go-genproto/yandex/cloud/compute/v1"
	"github.com/yandex-cloud/go-genproto/yandex/cloud/endpoint"
	iam "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

func TestJWTChecks(t *testing.T) {
	c := start(t, yandexfake.Options{})
	k := newKey(t, c.fake)
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	exchange := func(jwt string) error {
		_, err := c.iam.Create(context.Background(), &iam.CreateIamTokenRequest{Identity: &iam.CreateIamTokenRequest_Jwt{Jwt: jwt}})
		return err
	}
	wantCode(t, "a good jwt", exchange(k.jwt(t, jwtOpts{})), codes.OK)
	for _, tc := range []struct {
		name string
		o    jwtOpts
	}{
		{"signed by another key", jwtOpts{signer: other}},
		{"an unknown key id", jwtOpts{kid: "ajkunknown"}},
		{"another issuer", jwtOpts{iss: "ajeother"}},
		{"another audience", jwtOpts{aud: "https://example.com"}},
		{"expired", jwtOpts{iat: now.Add(-2 * time.Hour), exp: now.Add(-time.Hour)}},
		{"living longer than an hour", jwtOpts{exp: now.Add(2 * time.Hour)}},
		{"another algorithm", jwtOpts{alg: "RS256"}},
	} {
		wantCode(t, tc.name, exchange(k.jwt(t, tc.o)), codes.Unauthenticated)
	}
	wantCode(t, "not a jwt", exchange("nonsense"), codes.Unauthenticated)
	_, err = c.iam.Create(context.Background(), &iam.CreateIamTokenRequest{
		Identity: &iam.CreateIamTokenRequest_YandexPassportOauthToken{YandexPassportOauthToken: "y0_x"}})
	wantCode(t, "an OAuth token", err, codes.InvalidArgument)
}

func TestCallsNeedAToken(t *testing.T) {
	c := start(t, yandexfake.Options{})
	get := func(ctx context.Context) error {
		_, err := c.zones.Get(ctx, &compute.GetZoneRequest{ZoneId: "ru-central1-a"})
		return err
	}
	wantCode(t, "with the token", get(c.ctx), codes.OK)
	bg := context.Background()
	wantCode(t, "without a token", get(bg), codes.Unauthenticated)
	wantCode(t, "an unknown token", get(metadata.AppendToOutgoingContext(bg, "authorization", "Bearer t1.forged")), codes.Unauthenticated)
	wantCode(t, "not a bearer", get(metadata.AppendToOutgoingContext(bg, "authorization", "Basic x")), codes.Unauthenticated)
	c.fake.SetTokenTTL(time.Nanosecond)
	expired, err := c.fake.Token()
	if err != nil {
		t.Fatal(err)
	}
	wantCode(t, "an expired token", get(metadata.AppendToOutgoingContext(bg, "authorization", "Bearer "+expired)), codes.Unauthenticated)
	// Endpoint discovery needs none.
	resp, err := endpoint.NewApiEndpointServiceClient(c.conn).List(bg, &endpoint.ListApiEndpointsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]string{}
	for _, e := range resp.Endpoints {
		have[e.Id] = e.Address
	}
	for _, id := range []string{"compute", "iam", "operation"} {
		if have[id] != c.fake.Endpoint() {
			t.Errorf("endpoint %s at %q, want %q", id, have[id], c.fake.Endpoint())
		}
	}
}

func TestMetadataServer(t *testing.T) {
	c := start(t, yandexfake.Options{})
	srv := c.fake.MetadataServer("vm-1", "ru-central1-b", c.fake.FolderID())
	get := func(path string, flavor bool) (int, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if flavor {
			req.Header.Set("Metadata-Flavor", "Google")
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	if code, body := get(yandexfake.MetadataIDPath, true); code != 200 || body != "vm-1" {
		t.Fatalf("id: %d %q", code, body)
	}
	if code, body := get(yandexfake.MetadataZonePath, true); code != 200 || body != "projects/"+c.fake.FolderID()+"/zones/ru-central1-b" {
		t.Fatalf("zone: %d %q", code, body)
	}
	if code, _ := get(yandexfake.MetadataIDPath, false); code != http.StatusForbidden {
		t.Fatalf("without Metadata-Flavor: %d, want 403", code)
	}
	if code, _ := get("/computeMetadata/v1/instance/nothing", true); code != http.StatusNotFound {
		t.Fatalf("unknown path: %d, want 404", code)
	}
	code, body := get(yandexfake.MetadataTokenPath, true)
	var tok struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
		TokenType   string `json:"token_type"`
	}
	if err := json.Unmarshal([]byte(body), &tok); code != 200 || err != nil || tok.AccessToken == "" || tok.ExpiresIn <= 0 || tok.TokenType != "Bearer" {
		t.Fatalf("token: %d %q %v", code, body, err)
	}
	ctx := metadata.AppendToOutgoingContext(context.Background(), "authorization", "Bearer "+tok.AccessToken)
	if _, err := c.zones.List(ctx, &compute.ListZonesRequest{}); err != nil {
		t.Fatalf("the metadata service's token: %v", err)
	}
}

func iamReq(jwt string) *iam.CreateIamTokenRequest {
	return &iam.CreateIamTokenRequest{Identity: &iam.CreateIamTokenRequest_Jwt{Jwt: jwt}}
}
