package yandex

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	iampb "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	ycsdk "github.com/yandex-cloud/go-sdk"
	"github.com/yandex-cloud/go-sdk/iamkey"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// DefaultMetadataURL is the instance metadata service of a Yandex Compute
// instance (GCE-style paths, with the Metadata-Flavor: Google header).
const DefaultMetadataURL = "http://169.254.169.254"

// credentials returns the SDK credentials: the service-account key in
// keyFile, or (keyFile empty) the instance's service account through the
// metadata service at metadataURL. Secrets never leave here: errors name
// the file, never its content, and no token is logged.
func credentials(keyFile, metadataURL string) (ycsdk.Credentials, error) {
	if keyFile == "" {
		if metadataURL == "" {
			metadataURL = DefaultMetadataURL
		}
		return &instanceServiceAccount{url: strings.TrimSuffix(metadataURL, "/") +
			"/computeMetadata/v1/instance/service-accounts/default/token",
			client: &http.Client{Timeout: 10 * time.Second}}, nil
	}
	key, err := iamkey.ReadFromJSONFile(keyFile)
	if err != nil {
		// The parser's message may quote the file: say only where it is.
		return nil, fmt.Errorf("yandex: the service-account key file %s is not a key Yandex IAM issued (JSON with id, service_account_id, private_key)", keyFile)
	}
	creds, err := ycsdk.ServiceAccountKey(key)
	if err != nil {
		return nil, fmt.Errorf("yandex: the service-account key file %s cannot sign tokens (key id or service account missing, or the private key not an RSA key in PEM)", keyFile)
	}
	return &serviceAccountKey{jwt: creds.(ycsdk.ExchangeableCredentials)}, nil
}

// serviceAccountKey exchanges JWTs signed with a service-account key for
// IAM tokens, as the SDK's own credentials do, but reports each token
// expiring early (renewAt): the SDK uses a cached token up to the moment
// it expires, so a call made just before then reaches the API with a
// token that has expired in flight (Unauthenticated).
type serviceAccountKey struct {
	jwt ycsdk.ExchangeableCredentials
	// iam is the SDK the key's tokens are for (set once it is built): its
	// IAM token service, which needs no token itself.
	iam *ycsdk.SDK
}

func (*serviceAccountKey) YandexCloudAPICredentials() {}

// IAMToken exchanges a new JWT for an IAM token.
func (c *serviceAccountKey) IAMToken(ctx context.Context) (*iampb.CreateIamTokenResponse, error) {
	if c.iam == nil {
		return nil, fmt.Errorf("yandex: no API to exchange the key's JWT at")
	}
	req, err := c.jwt.IAMTokenRequest()
	if err != nil {
		return nil, fmt.Errorf("yandex: sign a JWT with the service-account key: %w", err)
	}
	resp, err := c.iam.IAM().IamToken().Create(ctx, req)
	if err != nil {
		return nil, err
	}
	return &iampb.CreateIamTokenResponse{IamToken: resp.GetIamToken(), ExpiresAt: renewAt(resp.GetExpiresAt())}, nil
}

// renewAt is when to stop using a token that expires at expires: a fifth
// of its remaining life early, at most ten minutes (a real IAM token lives
// 12 hours).
func renewAt(expires *timestamppb.Timestamp) *timestamppb.Timestamp {
	now := time.Now()
	if !expires.IsValid() {
		return timestamppb.New(now.Add(time.Minute))
	}
	ttl := expires.AsTime().Sub(now)
	return timestamppb.New(now.Add(ttl - min(ttl/5, 10*time.Minute)))
}

// instanceServiceAccount is the SDK's NonExchangeableCredentials of the
// instance's service account, from a metadata service at a configurable
// URL (the SDK's own reads its address from an environment variable).
type instanceServiceAccount struct {
	url    string
	client *http.Client
}

func (*instanceServiceAccount) YandexCloudAPICredentials() {}

// IAMToken fetches the instance service account's IAM token.
func (c *instanceServiceAccount) IAMToken(ctx context.Context) (*iampb.CreateIamTokenResponse, error) {
	body, _, err := metadataGet(ctx, c.client, c.url, 1<<20)
	if errors.Is(err, errMetadataStatus) {
		return nil, fmt.Errorf("yandex: instance service account token from %s: %v (does the instance have a service account?)", c.url, err)
	}
	if err != nil {
		return nil, fmt.Errorf("yandex: instance service account token from %s: %w", c.url, err)
	}
	var tok struct {
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(body, &tok); err != nil || tok.AccessToken == "" {
		return nil, fmt.Errorf("yandex: instance service account token from %s: the answer is not a token", c.url)
	}
	expires := timestamppb.New(time.Now().Add(time.Duration(tok.ExpiresIn) * time.Second))
	return &iampb.CreateIamTokenResponse{IamToken: tok.AccessToken, ExpiresAt: renewAt(expires)}, nil
}
