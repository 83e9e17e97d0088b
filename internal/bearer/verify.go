// SPDX-License-Identifier: MIT

package bearer

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
)

// Identity is what a verified token says of its job.
type Identity struct {
	// Name is the configured name of the issuer (Issuer.Name).
	Name string
	// Issuer and Subject are the token's "iss" and "sub".
	Issuer, Subject string
	// Groups are its "wlcg.groups".
	Groups []string
	// Scopes are its "scope", split.
	Scopes []string
	// Expires is its "exp".
	Expires time.Time
}

// algorithms are the signature algorithms accepted: asymmetric only.
var algorithms = []jose.SignatureAlgorithm{
	jose.RS256, jose.RS384, jose.RS512, jose.PS256, jose.PS384, jose.PS512,
	jose.ES256, jose.ES384, jose.ES512, jose.EdDSA,
}

// Bounds of what a token may carry.
const (
	maxGroups = 64
	maxScopes = 64
	maxValue  = 256
)

// Verifier checks tokens against the configured issuers. Safe for
// concurrent use; make one with New.
type Verifier struct {
	cfg    Config
	byURL  map[string]*keys
	issuer map[string]Issuer
	log    *slog.Logger
}

// New makes a Verifier for cfg. It reads the cached key sets but fetches
// nothing: Run does, and so does the first token of an issuer whose keys
// are unknown.
func New(cfg Config, log *slog.Logger) (*Verifier, error) {
	cfg.setDefaults()
	v := &Verifier{cfg: cfg, byURL: map[string]*keys{}, issuer: map[string]Issuer{}, log: log}
	for _, iss := range cfg.Issuers {
		if err := iss.Validate(); err != nil {
			return nil, fmt.Errorf("issuer %s: %w", iss.URL, err)
		}
		if _, dup := v.byURL[iss.URL]; dup {
			return nil, fmt.Errorf("issuer %s listed twice", iss.URL)
		}
		if len(iss.Audiences) == 0 && len(cfg.Audiences) == 0 {
			return nil, fmt.Errorf("issuer %s: no audience: list the gateway's name in audience", iss.URL)
		}
		k, err := newKeys(iss, &v.cfg, log)
		if err != nil {
			return nil, err
		}
		v.byURL[iss.URL], v.issuer[iss.URL] = k, iss
	}
	return v, nil
}

// Run fetches every issuer's keys at once and then whenever they are
// older than Refresh (retrying a failed fetch every MinRefetch), until ctx
// ends.
func (v *Verifier) Run(ctx context.Context) {
	tick := time.NewTicker(v.cfg.MinRefetch)
	defer tick.Stop()
	for first := true; ; first = false {
		for _, k := range v.byURL {
			k.mu.Lock()
			due := first || k.lastErr != nil || v.cfg.Now().Sub(k.fetched) >= v.cfg.Refresh
			k.mu.Unlock()
			if due {
				k.refresh(ctx, true)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Verify checks raw and returns what it identifies. Errors wrap
// ErrRefused (a token that is not good here, with the reason) or
// ErrUnavailable (the issuer's keys are not known now).
func (v *Verifier) Verify(ctx context.Context, raw string) (Identity, error) {
	raw = strings.TrimSpace(raw)
	if len(raw) > MaxTokenSize {
		return Identity{}, fmt.Errorf("%w: %d bytes, more than %d", ErrRefused, len(raw), MaxTokenSize)
	}
	if err := checkHeader(raw); err != nil {
		return Identity{}, err
	}
	tok, err := jwt.ParseSigned(raw, algorithms)
	if err != nil {
		return Identity{}, fmt.Errorf("%w: not a signed JWT of an accepted algorithm (%v)", ErrRefused, err)
	}
	if len(tok.Headers) != 1 {
		return Identity{}, fmt.Errorf("%w: %d signatures, want 1", ErrRefused, len(tok.Headers))
	}
	h := tok.Headers[0]
	// The issuer, unverified, only to find its keys: the claims are
	// checked again once the signature is.
	var pre jwt.Claims
	if err := tok.UnsafeClaimsWithoutVerification(&pre); err != nil {
		return Identity{}, fmt.Errorf("%w: claims: %v", ErrRefused, err)
	}
	k, ok := v.byURL[pre.Issuer]
	if !ok {
		return Identity{}, fmt.Errorf("%w: issuer %q is not one this gateway trusts", ErrRefused, clip(pre.Issuer))
	}
	iss := v.issuer[pre.Issuer]
	if h.KeyID == "" {
		return Identity{}, fmt.Errorf("%w: no \"kid\" in the token's header", ErrRefused)
	}
	key, err := k.lookup(ctx, h.KeyID)
	if err != nil {
		return Identity{}, err
	}
	if !fits(key, h.Algorithm) {
		return Identity{}, fmt.Errorf("%w: algorithm %s does not fit key %q of issuer %s", ErrRefused, h.Algorithm, clip(h.KeyID), iss.URL)
	}
	var c jwt.Claims
	var extra struct {
		Scope  *string  `json:"scope"`
		Groups []string `json:"wlcg.groups"`
	}
	if err := tok.Claims(key.Key, &c, &extra); err != nil {
		return Identity{}, fmt.Errorf("%w: signature of issuer %s does not verify (forged or altered token)", ErrRefused, iss.URL)
	}
	auds := iss.Audiences
	if len(auds) == 0 {
		auds = v.cfg.Audiences
	}
	now := v.cfg.Now()
	switch {
	case len(auds) == 0: // New refuses this; an empty list would check no audience
		return Identity{}, fmt.Errorf("%w: no audience configured for issuer %s", ErrRefused, iss.URL)
	case c.Issuer != iss.URL:
		return Identity{}, fmt.Errorf("%w: issuer %q", ErrRefused, clip(c.Issuer))
	case c.Expiry == nil:
		return Identity{}, fmt.Errorf("%w: no \"exp\": the gateway takes only tokens that expire", ErrRefused)
	case c.Subject == "" || len(c.Subject) > maxValue || !printable(c.Subject):
		return Identity{}, fmt.Errorf("%w: missing or unreadable \"sub\"", ErrRefused)
	}
	err = c.ValidateWithLeeway(jwt.Expected{AnyAudience: auds, Time: now}, v.cfg.Leeway)
	switch {
	case errors.Is(err, jwt.ErrExpired):
		return Identity{}, fmt.Errorf("%w: expired at %s: the pilot must refresh the job's token (BEARER_TOKEN_FILE)", ErrRefused, c.Expiry.Time().UTC().Format(time.RFC3339))
	case errors.Is(err, jwt.ErrNotValidYet), errors.Is(err, jwt.ErrIssuedInTheFuture):
		return Identity{}, fmt.Errorf("%w: not valid yet (nbf/iat in the future): check the clocks of the issuer and the gateway", ErrRefused)
	case errors.Is(err, jwt.ErrInvalidAudience):
		return Identity{}, fmt.Errorf("%w: audience %q is not this gateway's (want one of %q): ask the issuer for a token with aud set to the gateway", ErrRefused, clipAll(c.Audience), auds)
	case err != nil:
		return Identity{}, fmt.Errorf("%w: %v", ErrRefused, err)
	}
	id := Identity{Name: iss.Name, Issuer: c.Issuer, Subject: c.Subject, Expires: c.Expiry.Time()}
	if extra.Scope != nil {
		id.Scopes = strings.Fields(*extra.Scope)
	}
	id.Groups = extra.Groups
	if len(id.Groups) > maxGroups || len(id.Scopes) > maxScopes {
		return Identity{}, fmt.Errorf("%w: more than %d groups or %d scopes", ErrRefused, maxGroups, maxScopes)
	}
	for _, g := range id.Groups {
		if g == "" || len(g) > maxValue || !printable(g) {
			return Identity{}, fmt.Errorf("%w: unreadable group in \"wlcg.groups\"", ErrRefused)
		}
	}
	for _, s := range iss.Scopes {
		if !grants(id.Scopes, s) {
			return Identity{}, fmt.Errorf("%w: no scope %q (the token has %q): ask the issuer for a token with it", ErrRefused, s, clipAll(id.Scopes))
		}
	}
	if len(iss.Groups) > 0 && !anyGroup(id.Groups, iss.Groups) {
		return Identity{}, fmt.Errorf("%w: in none of the groups %q (the token's \"wlcg.groups\": %q)", ErrRefused, iss.Groups, clipAll(id.Groups))
	}
	return id, nil
}

// checkHeader refuses, with a clear reason, the algorithms go-jose would
// refuse with a generic error: "none" and HMAC.
func checkHeader(raw string) error {
	head, _, ok := strings.Cut(raw, ".")
	if !ok {
		return fmt.Errorf("%w: not a JWT (want header.payload.signature)", ErrRefused)
	}
	b, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		return fmt.Errorf("%w: not a JWT: header: %v", ErrRefused, err)
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return fmt.Errorf("%w: not a JWT: header: %v", ErrRefused, err)
	}
	switch a := strings.ToUpper(h.Alg); {
	case a == "NONE" || a == "":
		return fmt.Errorf("%w: unsigned token (alg %q)", ErrRefused, clip(h.Alg))
	case strings.HasPrefix(a, "HS"):
		return fmt.Errorf("%w: HMAC algorithm %s: issuers sign with public-key algorithms only", ErrRefused, clip(h.Alg))
	case !slices.Contains(algorithms, jose.SignatureAlgorithm(h.Alg)):
		return fmt.Errorf("%w: algorithm %q not accepted", ErrRefused, clip(h.Alg))
	}
	return nil
}

// fits reports whether alg is an algorithm of key's type (and of the
// key's own "alg", if it names one).
func fits(key jose.JSONWebKey, alg string) bool {
	if key.Algorithm != "" && key.Algorithm != alg {
		return false
	}
	switch key.Key.(type) {
	case *rsa.PublicKey:
		return strings.HasPrefix(alg, "RS") || strings.HasPrefix(alg, "PS")
	case *ecdsa.PublicKey:
		return strings.HasPrefix(alg, "ES")
	case ed25519.PublicKey:
		return alg == string(jose.EdDSA)
	}
	return false
}

// clip bounds and quotes-safe an untrusted value for a message.
func clip(s string) string {
	if len(s) > 80 {
		s = s[:80] + "..."
	}
	if !printable(s) {
		return fmt.Sprintf("%q", s)
	}
	return s
}

func clipAll(l []string) []string {
	if len(l) > 8 {
		l = append(l[:8:8], "...")
	}
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = clip(s)
	}
	return out
}
