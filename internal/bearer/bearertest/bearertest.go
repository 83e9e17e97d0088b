// SPDX-License-Identifier: MIT

// Package bearertest is a token issuer for tests: its own CA and TLS
// certificate, RSA and EC signing keys, a discovery document and a key
// set that can rotate, and tokens minted with any claims (including the
// malformed and forged ones a verifier must refuse). Serve runs it in
// process; the e2e tests write the same documents for a file server in
// another namespace (Write).
package bearertest

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// Key is a signing key of the issuer.
type Key struct {
	ID   string
	Alg  jose.SignatureAlgorithm
	Priv crypto.Signer
}

// NewRSA makes an RSA-2048 key for RS256 named id.
func NewRSA(id string) *Key {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		panic(err)
	}
	return &Key{ID: id, Alg: jose.RS256, Priv: k}
}

// NewEC makes a P-256 key for ES256 named id.
func NewEC(id string) *Key {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	return &Key{ID: id, Alg: jose.ES256, Priv: k}
}

// Public is k's public JWK.
func (k *Key) Public() jose.JSONWebKey {
	return jose.JSONWebKey{Key: k.Priv.Public(), KeyID: k.ID, Algorithm: string(k.Alg), Use: "sig"}
}

// Sign returns a compact JWS of claims signed by k with its kid.
func (k *Key) Sign(claims any) string {
	return k.SignAs(k.ID, claims)
}

// SignAs is Sign with header kid set to kid.
func (k *Key) SignAs(kid string, claims any) string {
	return sign(jose.SigningKey{Algorithm: k.Alg, Key: k.Priv}, kid, claims)
}

// HMACWithPublicKey returns claims "signed" with HS256 using k's public
// key (PEM of its PKIX form) as the secret: the alg-confusion forgery.
func (k *Key) HMACWithPublicKey(claims any) string {
	der, err := x509.MarshalPKIXPublicKey(k.Priv.Public())
	if err != nil {
		panic(err)
	}
	secret := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	return sign(jose.SigningKey{Algorithm: jose.HS256, Key: secret}, k.ID, claims)
}

// sign returns the compact JWS of claims signed with sk, header kid.
func sign(sk jose.SigningKey, kid string, claims any) string {
	s, err := jose.NewSigner(sk, (&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid))
	if err != nil {
		panic(err)
	}
	payload, _ := json.Marshal(claims)
	jws, err := s.Sign(payload)
	if err != nil {
		panic(err)
	}
	out, err := jws.CompactSerialize()
	if err != nil {
		panic(err)
	}
	return out
}

// Unsigned returns claims as a JWT with alg "none" and kid.
func Unsigned(kid string, claims any) string {
	h, _ := json.Marshal(map[string]string{"alg": "none", "typ": "JWT", "kid": kid})
	p, _ := json.Marshal(claims)
	return base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(p) + "."
}

// Claims returns the claims of a WLCG token of iss for sub and aud, valid
// from now-1m for ttl, with scope and groups.
func Claims(iss, sub, aud string, ttl time.Duration, scope string, groups ...string) map[string]any {
	now := time.Now()
	c := map[string]any{
		"iss": iss, "sub": sub, "aud": aud, "wlcg.ver": "1.0",
		"iat": now.Add(-time.Minute).Unix(), "nbf": now.Add(-time.Minute).Unix(), "exp": now.Add(ttl).Unix(),
		"jti": fmt.Sprint(now.UnixNano()),
	}
	if scope != "" {
		c["scope"] = scope
	}
	if groups != nil {
		c["wlcg.groups"] = groups
	}
	return c
}

// TLS is an issuer's CA and the server certificate it signed.
type TLS struct {
	CAPEM   []byte
	CertPEM []byte
	KeyPEM  []byte
	Cert    tls.Certificate
}

// NewTLS makes a CA and a server certificate for hosts (IP literals as
// IP SANs), valid for a day.
func NewTLS(hosts ...string) TLS {
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "bearertest CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	ca, _ = x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "bearertest issuer"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			leaf.IPAddresses = append(leaf.IPAddresses, ip)
		} else {
			leaf.DNSNames = append(leaf.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		panic(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	t := TLS{
		CAPEM:   pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}
	t.Cert, err = tls.X509KeyPair(t.CertPEM, t.KeyPEM)
	if err != nil {
		panic(err)
	}
	return t
}

// Discovery is the discovery document of issuer url with its key set at
// url + "/jwks".
func Discovery(url string) []byte {
	b, _ := json.Marshal(map[string]any{"issuer": url, "jwks_uri": url + "/jwks",
		"id_token_signing_alg_values_supported": []string{"RS256", "ES256"}})
	return b
}

// JWKS is the key set of keys' public halves.
func JWKS(keys ...*Key) []byte {
	var set jose.JSONWebKeySet
	for _, k := range keys {
		set.Keys = append(set.Keys, k.Public())
	}
	b, _ := json.Marshal(set)
	return b
}

// Write puts the files the testpeer "issuer" serves into dir: tls.crt,
// tls.key, openid-configuration and jwks.json. Rewriting jwks.json
// rotates the keys of a running server.
func Write(dir, url string, t TLS, keys ...*Key) error {
	for name, b := range map[string][]byte{"tls.crt": t.CertPEM, "tls.key": t.KeyPEM,
		"openid-configuration": Discovery(url), "jwks.json": JWKS(keys...)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// FileHandler serves dir as the testpeer "issuer" does: the discovery
// document and the key set, read at every request.
func FileHandler(dir string) http.Handler {
	mux := http.NewServeMux()
	serve := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, err := os.ReadFile(filepath.Join(dir, name))
			if err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(b)
		}
	}
	mux.Handle("GET /.well-known/openid-configuration", serve("openid-configuration"))
	mux.Handle("GET /jwks", serve("jwks.json"))
	return mux
}

// Issuer is an issuer served in process on 127.0.0.1 over TLS with its
// own CA. Safe for concurrent use.
type Issuer struct {
	URL    string
	TLS    TLS
	CAFile string

	srv     *http.Server
	ln      net.Listener
	fetches atomic.Int64
	asked   atomic.Int64 // key set requests received, answered or not
	delay   atomic.Int64 // how long the key set's answer waits (ns)
	down    atomic.Bool

	mu   sync.Mutex
	keys []*Key
}

// Serve starts an issuer publishing keys; dir receives its CA file.
// Close stops it.
func Serve(dir string, keys ...*Key) (*Issuer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	iss := &Issuer{URL: "https://" + ln.Addr().String(), TLS: NewTLS("127.0.0.1"), ln: ln, keys: keys}
	iss.CAFile = filepath.Join(dir, "issuer-ca.pem")
	if err := os.WriteFile(iss.CAFile, iss.TLS.CAPEM, 0o644); err != nil {
		ln.Close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, r *http.Request) {
		if iss.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write(Discovery(iss.URL))
	})
	mux.HandleFunc("GET /jwks", func(w http.ResponseWriter, r *http.Request) {
		iss.asked.Add(1)
		time.Sleep(time.Duration(iss.delay.Load()))
		if iss.down.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		iss.fetches.Add(1)
		iss.mu.Lock()
		b := JWKS(iss.keys...)
		iss.mu.Unlock()
		_, _ = w.Write(b)
	})
	iss.srv = &http.Server{Handler: mux, TLSConfig: &tls.Config{Certificates: []tls.Certificate{iss.TLS.Cert}}, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = iss.srv.ServeTLS(ln, "", "") }()
	return iss, nil
}

// SetKeys replaces the published key set (a rotation).
func (i *Issuer) SetKeys(keys ...*Key) {
	i.mu.Lock()
	i.keys = keys
	i.mu.Unlock()
}

// SetDown makes the issuer answer 503 (down) or serve again.
func (i *Issuer) SetDown(down bool) { i.down.Store(down) }

// SetDelay makes the key set's answers wait d (a slow issuer).
func (i *Issuer) SetDelay(d time.Duration) { i.delay.Store(int64(d)) }

// Asked is how many times the key set was asked for, answered or not yet.
func (i *Issuer) Asked() int { return int(i.asked.Load()) }

// Fetches is how many times the key set was served.
func (i *Issuer) Fetches() int { return int(i.fetches.Load()) }

// Close stops the server.
func (i *Issuer) Close() error { return i.srv.Close() }
