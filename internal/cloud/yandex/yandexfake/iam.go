package yandexfake

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
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	iam "github.com/yandex-cloud/go-genproto/yandex/cloud/iam/v1"
)

// TokenAudience is the audience a service account's JWT must name.
const TokenAudience = "https://iam.api.cloud.yandex.net/iam/v1/tokens"

// maxJWTLifetime is the longest a JWT may live (exp - iat), as the IAM
// service requires.
const maxJWTLifetime = time.Hour

// keyBits is the size of the RSA keys the fake issues (the real IAM issues
// 2048 or 4096 bits; 2048 keeps the tests fast).
const keyBits = 2048

// KeyFile is a service-account key file as Yandex issues it (`yc iam key
// create --output key.json`).
type KeyFile struct {
	ID               string `json:"id"`
	ServiceAccountID string `json:"service_account_id"`
	CreatedAt        string `json:"created_at"`
	KeyAlgorithm     string `json:"key_algorithm"`
	PublicKey        string `json:"public_key"`
	PrivateKey       string `json:"private_key"`
}

// WriteServiceAccountKey issues a key of a new service account
// (NewServiceAccountKey) and writes its key file at path, readable by its
// owner only, as a mounted Secret would hold it; it returns the file's
// content too.
func (f *Fake) WriteServiceAccountKey(path string) ([]byte, error) {
	raw, err := f.NewServiceAccountKey()
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, raw, 0o600); err != nil {
		return nil, fmt.Errorf("yandexfake: write the key file: %w", err)
	}
	return raw, nil
}

// NewServiceAccountKey issues a key of a new service account and returns
// its key file (JSON, as Yandex issues it: the private key is PKCS#8 PEM
// preceded by Yandex's "PLEASE DO NOT REMOVE THIS LINE!" line). The fake
// accepts JWTs signed with it.
func (f *Fake) NewServiceAccountKey() ([]byte, error) {
	priv, err := rsa.GenerateKey(rand.Reader, keyBits)
	if err != nil {
		return nil, fmt.Errorf("yandexfake: generate key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("yandexfake: marshal private key: %w", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&priv.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("yandexfake: marshal public key: %w", err)
	}
	f.mu.Lock()
	keyID, saID := f.newID("ajk"), f.newID("aje")
	f.keys[keyID] = saKey{serviceAccountID: saID, public: &priv.PublicKey}
	f.mu.Unlock()
	kf := KeyFile{
		ID:               keyID,
		ServiceAccountID: saID,
		CreatedAt:        time.Now().UTC().Format(time.RFC3339),
		KeyAlgorithm:     "RSA_2048",
		PublicKey:        string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub})),
		PrivateKey: "PLEASE DO NOT REMOVE THIS LINE! Yandex.Cloud SA Key ID <" + keyID + ">\n" +
			string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
	}
	return json.MarshalIndent(kf, "", "   ")
}

type iamService struct {
	iam.UnimplementedIamTokenServiceServer
	f *Fake
}

// Create exchanges a service account's JWT for an IAM token.
func (s iamService) Create(_ context.Context, req *iam.CreateIamTokenRequest) (*iam.CreateIamTokenResponse, error) {
	jwt := req.GetJwt()
	if jwt == "" {
		return nil, status.Error(codes.InvalidArgument, "only a service account's jwt is accepted by this fake")
	}
	if err := s.f.verifyJWT(jwt, time.Now()); err != nil {
		return nil, status.Errorf(codes.Unauthenticated, "invalid jwt: %v", err)
	}
	token, expires, err := s.f.issueToken()
	if err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &iam.CreateIamTokenResponse{IamToken: token, ExpiresAt: timestamppb.New(expires)}, nil
}

type jwtHeader struct {
	Alg string `json:"alg"`
	Kid string `json:"kid"`
}

type jwtClaims struct {
	Iss string          `json:"iss"`
	Aud json.RawMessage `json:"aud"`
	Iat int64           `json:"iat"`
	Exp int64           `json:"exp"`
}

// verifyJWT checks a service account's JWT: PS256 signature by a key the
// fake issued, issuer, audience, expiry and lifetime.
func (f *Fake) verifyJWT(token string, now time.Time) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return errors.New("not a signed jwt")
	}
	var h jwtHeader
	if err := decodeSegment(parts[0], &h); err != nil {
		return fmt.Errorf("header: %w", err)
	}
	if h.Alg != "PS256" {
		return fmt.Errorf("algorithm %q, want PS256", h.Alg)
	}
	f.mu.Lock()
	key, ok := f.keys[h.Kid]
	f.mu.Unlock()
	if !ok {
		return fmt.Errorf("unknown key id %q", h.Kid)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return fmt.Errorf("signature: %w", err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPSS(key.public, crypto.SHA256, digest[:], sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthAuto}); err != nil {
		return errors.New("bad signature")
	}
	var c jwtClaims
	if err := decodeSegment(parts[1], &c); err != nil {
		return fmt.Errorf("claims: %w", err)
	}
	if c.Iss != key.serviceAccountID {
		return fmt.Errorf("issuer %q is not the key's service account", c.Iss)
	}
	if !audienceHas(c.Aud, TokenAudience) {
		return fmt.Errorf("audience is not %s", TokenAudience)
	}
	exp, iat := time.Unix(c.Exp, 0), time.Unix(c.Iat, 0)
	if !now.Before(exp) {
		return errors.New("expired")
	}
	if c.Iat == 0 || exp.Sub(iat) > maxJWTLifetime {
		return fmt.Errorf("lifetime longer than %s", maxJWTLifetime)
	}
	return nil
}

func decodeSegment(seg string, v any) error {
	raw, err := base64.RawURLEncoding.DecodeString(seg)
	if err != nil {
		return err
	}
	return json.Unmarshal(raw, v)
}

// audienceHas reports whether a JWT "aud" (a string or a list) has want.
func audienceHas(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	return json.Unmarshal(raw, &many) == nil && slices.Contains(many, want)
}

// issueToken makes a new IAM token valid for the current TokenTTL.
func (f *Fake) issueToken() (string, time.Time, error) {
	b := make([]byte, 48)
	if _, err := rand.Read(b); err != nil {
		return "", time.Time{}, err
	}
	token := "t1." + base64.RawURLEncoding.EncodeToString(b)
	f.mu.Lock()
	defer f.mu.Unlock()
	expires := time.Now().Add(f.opts.TokenTTL)
	f.tokens[token] = expires
	return token, expires, nil
}

// authenticate checks the call's "authorization: Bearer" token.
func (f *Fake) authenticate(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return status.Error(codes.Unauthenticated, "the request has no authorization metadata")
	}
	token, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok {
		return status.Error(codes.Unauthenticated, "authorization is not a Bearer token")
	}
	f.mu.Lock()
	expires, known := f.tokens[token]
	f.mu.Unlock()
	switch {
	case !known:
		return status.Error(codes.Unauthenticated, "unknown iam token")
	case !time.Now().Before(expires):
		return status.Error(codes.Unauthenticated, "the iam token has expired")
	}
	return nil
}

// Token issues an IAM token without a key (as the metadata service gives
// an instance's service account one), for tests that call the API
// directly.
func (f *Fake) Token() (string, error) {
	t, _, err := f.issueToken()
	return t, err
}
