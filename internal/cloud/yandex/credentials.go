package yandex

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
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	iampb "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
	"github.com/yandex-cloud/go-sdk/iamkey"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// DefaultMetadataURL is the instance metadata service of a Yandex Compute
// instance (GCE-style paths, with the Metadata-Flavor: Google header).
const DefaultMetadataURL = "http://169.254.169.254"

// tokenAudience is the audience a service account's JWT names: the IAM
// token service.
const tokenAudience = "https://iam.api.cloud.yandex.net/iam/v1/tokens"

// jwtLifetime is how long a service account's JWT is valid (IAM accepts
// at most an hour).
const jwtLifetime = time.Hour

// iamTokenSource issues IAM tokens: a service-account key's, or the
// instance's service account's.
type iamTokenSource interface {
	IAMToken(ctx context.Context) (*iampb.CreateIamTokenResponse, error)
}

// credentials returns the source of csid's IAM tokens: the
// service-account key in keyFile, or (keyFile empty) the instance's
// service account through the metadata service at metadataURL. Secrets
// never leave here: errors name the file, never its content, and no token
// is logged.
func credentials(keyFile, metadataURL string) (iamTokenSource, error) {
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
	priv, err := rsaKey(key.GetPrivateKey())
	if err != nil || key.GetId() == "" || key.GetServiceAccountId() == "" {
		return nil, fmt.Errorf("yandex: the service-account key file %s cannot sign tokens (key id or service account missing, or the private key not an RSA key in PEM)", keyFile)
	}
	return &serviceAccountKey{keyID: key.GetId(), account: key.GetServiceAccountId(), priv: priv}, nil
}

// rsaKey parses the PEM private key of a service-account key (PKCS #8,
// or PKCS #1; text before the PEM block, as Yandex writes, is skipped).
func rsaKey(text string) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode([]byte(text))
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, err
	}
	rk, ok := k.(*rsa.PrivateKey)
	if !ok {
		return nil, errors.New("not an RSA key")
	}
	return rk, nil
}

// serviceAccountKey exchanges JWTs signed with a service-account key for
// IAM tokens at the IAM token service (set once the API is dialled), and
// reports each token expiring early (renewAt), so that no call reaches the
// API with a token that expires in flight.
type serviceAccountKey struct {
	keyID, account string
	priv           *rsa.PrivateKey
	iam            iampb.IamTokenServiceClient
}

// IAMToken exchanges a new JWT for an IAM token.
func (c *serviceAccountKey) IAMToken(ctx context.Context) (*iampb.CreateIamTokenResponse, error) {
	if c.iam == nil {
		return nil, fmt.Errorf("yandex: no API to exchange the key's JWT at")
	}
	jwt, err := c.signedJWT(time.Now())
	if err != nil {
		return nil, fmt.Errorf("yandex: sign a JWT with the service-account key: %w", err)
	}
	resp, err := c.iam.Create(ctx, &iampb.CreateIamTokenRequest{Identity: &iampb.CreateIamTokenRequest_Jwt{Jwt: jwt}})
	if err != nil {
		return nil, err
	}
	return &iampb.CreateIamTokenResponse{IamToken: resp.GetIamToken(), ExpiresAt: renewAt(resp.GetExpiresAt())}, nil
}

// signedJWT is the key's JWT for the IAM token service, signed PS256 (RSA
// PSS with SHA-256, the salt as long as the hash) as Yandex IAM requires.
// The near-copy of this and rsaKey in yandexfake's harness is deliberate: the fake checks the backend independently and signs broken JWTs.
func (c *serviceAccountKey) signedJWT(now time.Time) (string, error) {
	segment := func(v any) (string, error) {
		raw, err := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(raw), err
	}
	header, err := segment(map[string]string{"typ": "JWT", "alg": "PS256", "kid": c.keyID})
	if err != nil {
		return "", err
	}
	claims, err := segment(map[string]any{"iss": c.account, "aud": tokenAudience,
		"iat": now.Unix(), "exp": now.Add(jwtLifetime).Unix()})
	if err != nil {
		return "", err
	}
	digest := sha256.Sum256([]byte(header + "." + claims))
	sig, err := rsa.SignPSS(rand.Reader, c.priv, crypto.SHA256, digest[:], &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash})
	if err != nil {
		return "", err
	}
	return header + "." + claims + "." + base64.RawURLEncoding.EncodeToString(sig), nil
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

// instanceServiceAccount issues the instance service account's IAM tokens
// from a metadata service at a configurable URL.
type instanceServiceAccount struct {
	url    string
	client *http.Client
}

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

// tokens caches the source's IAM token until it should be renewed, and
// puts it on every call as gRPC per-call credentials. A renewal holds the
// others back: one exchange at a time.
type tokens struct {
	src   iamTokenSource
	mu    sync.Mutex
	token string
	until time.Time
}

// GetRequestMetadata is the call's "authorization: Bearer <IAM token>".
func (t *tokens) GetRequestMetadata(ctx context.Context, _ ...string) (map[string]string, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.token == "" || !time.Now().Before(t.until) {
		resp, err := t.src.IAMToken(ctx)
		if err != nil {
			return nil, fmt.Errorf("yandex: get an IAM token: %w", err)
		}
		t.token, t.until = resp.GetIamToken(), resp.GetExpiresAt().AsTime()
	}
	return map[string]string{"authorization": "Bearer " + t.token}, nil
}

// RequireTransportSecurity is false: the fake API of the tests is
// plaintext (csid dials the real one with TLS).
func (*tokens) RequireTransportSecurity() bool { return false }
