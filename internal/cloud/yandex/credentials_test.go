package yandex

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/csid-dev/csid/internal/cloud/yandex/yandexfake"
)

// The private key of a service-account key parses as Yandex writes it (a
// comment line, then PKCS #8 PEM) and as PKCS #1; a key that is not RSA
// cannot sign PS256 and is refused.
func TestRSAKeyFormats(t *testing.T) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pkcs8, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	ec, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ecDER, err := x509.MarshalPKCS8PrivateKey(ec)
	if err != nil {
		t.Fatal(err)
	}
	block := func(der []byte, typ string) string {
		return string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}))
	}
	for name, text := range map[string]string{
		"yandex's": "PLEASE DO NOT REMOVE THIS LINE! Yandex.Cloud SA Key ID <ajeexample>\n" + block(pkcs8, "PRIVATE KEY"),
		"pkcs1":    block(x509.MarshalPKCS1PrivateKey(k), "RSA PRIVATE KEY"),
	} {
		got, err := rsaKey(text)
		if err != nil || !got.Equal(k) {
			t.Errorf("%s: rsaKey = %v; want the key", name, err)
		}
	}
	for name, text := range map[string]string{"ecdsa": block(ecDER, "PRIVATE KEY"), "no pem": "not a key", "empty": ""} {
		if _, err := rsaKey(text); err == nil {
			t.Errorf("%s: rsaKey accepted it", name)
		}
	}
}

// The JWT is what Yandex IAM exchanges: PS256 over header.claims by the
// key, the key id in the header, the service account as issuer, the token
// service as audience (the fake's constant, not the backend's own, so that
// a typo in either fails), an hour's lifetime.
func TestSignedJWT(t *testing.T) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	c := &serviceAccountKey{keyID: "ajekey", account: "ajeaccount", priv: k}
	now := time.Unix(1_800_000_000, 0)
	jwt, err := c.signedJWT(now)
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("%d parts", len(parts))
	}
	decode := func(seg string, v any) {
		raw, err := base64.RawURLEncoding.DecodeString(seg)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	var h map[string]string
	decode(parts[0], &h)
	var claims struct {
		Iss, Aud string
		Iat, Exp int64
	}
	decode(parts[1], &claims)
	if h["alg"] != "PS256" || h["kid"] != "ajekey" || h["typ"] != "JWT" {
		t.Errorf("header %v", h)
	}
	if claims.Iss != "ajeaccount" || claims.Aud != yandexfake.TokenAudience || claims.Iat != now.Unix() || claims.Exp != now.Add(time.Hour).Unix() {
		t.Errorf("claims %+v", claims)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPSS(&k.PublicKey, crypto.SHA256, digest[:], sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash}); err != nil {
		t.Errorf("signature: %v", err)
	}
}

// A token is used until a fifth of its remaining life before it expires,
// at most ten minutes early; an answer without a valid expiry is renewed
// within a minute.
func TestRenewAt(t *testing.T) {
	for _, tc := range []struct {
		name        string
		expiresIn   time.Duration
		wantEarlyBy time.Duration
	}{
		{"a real token's 12 hours", 12 * time.Hour, 10 * time.Minute},
		{"10 minutes", 10 * time.Minute, 2 * time.Minute},
		{"5 seconds", 5 * time.Second, time.Second},
	} {
		expires := time.Now().Add(tc.expiresIn)
		got := renewAt(timestamppb.New(expires)).AsTime()
		if d := expires.Sub(got) - tc.wantEarlyBy; d < -50*time.Millisecond || d > 50*time.Millisecond {
			t.Errorf("%s: renewed %s before expiry, want %s", tc.name, expires.Sub(got), tc.wantEarlyBy)
		}
	}
	if got := time.Until(renewAt(nil).AsTime()); got <= 0 || got > time.Minute {
		t.Errorf("no expiry: renewed in %s, want within a minute", got)
	}
}
