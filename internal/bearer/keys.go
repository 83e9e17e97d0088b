// SPDX-License-Identifier: MIT

package bearer

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"

	"github.com/airlock-vpn/airlock/internal/statefile"
)

// maxDocument bounds a discovery document or key set.
const maxDocument = 1 << 20

// keys is one issuer's key set and how to refresh it. Safe for concurrent
// use.
type keys struct {
	iss    Issuer
	client *http.Client
	cache  string // file, "" for none
	cfg    *Config
	log    *slog.Logger

	// fetchMu serializes fetches: callers that find an unknown kid
	// while a fetch runs wait for it instead of starting another.
	fetchMu sync.Mutex

	mu      sync.Mutex
	set     map[string]jose.JSONWebKey // by kid
	fetched time.Time                  // when set was fetched (zero: none)
	tried   time.Time                  // last fetch attempt
	lastErr error                      // of the last attempt, nil if it succeeded
}

// cached is a cache file's content.
type cached struct {
	Issuer  string          `json:"issuer"`
	JWKSURI string          `json:"jwks_uri"`
	Fetched time.Time       `json:"fetched"`
	Keys    json.RawMessage `json:"keys"`
}

func newKeys(iss Issuer, cfg *Config, log *slog.Logger) (*keys, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if iss.CAFile != "" {
		pem, err := os.ReadFile(iss.CAFile)
		if err != nil {
			return nil, fmt.Errorf("issuer %s: read ca_file: %w", iss.URL, err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("issuer %s: ca_file %s holds no PEM certificate", iss.URL, iss.CAFile)
		}
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		Proxy:               http.ProxyFromEnvironment,
		TLSHandshakeTimeout: cfg.Timeout,
		MaxIdleConns:        2,
		IdleConnTimeout:     time.Minute,
	}
	k := &keys{
		iss: iss, cfg: cfg, log: log.With("issuer", iss.URL),
		client: &http.Client{Transport: tr, Timeout: cfg.Timeout, CheckRedirect: func(r *http.Request, via []*http.Request) error {
			if r.URL.Scheme != "https" {
				return fmt.Errorf("redirect to %s: not https", r.URL.Redacted())
			}
			if len(via) >= 5 {
				return errors.New("more than 5 redirects")
			}
			return nil
		}},
	}
	if cfg.CacheDir != "" {
		sum := sha256.Sum256([]byte(iss.URL))
		k.cache = filepath.Join(cfg.CacheDir, "jwks-"+hex.EncodeToString(sum[:8])+".json")
		k.loadCache()
	}
	return k, nil
}

// loadCache reads the key set the last run kept, if any.
func (k *keys) loadCache() {
	b, err := os.ReadFile(k.cache)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var c cached
	if err == nil {
		err = json.Unmarshal(b, &c)
	}
	var set map[string]jose.JSONWebKey
	if err == nil && c.Issuer != k.iss.URL {
		err = fmt.Errorf("cache of issuer %q", c.Issuer)
	}
	if err == nil {
		set, err = parseKeySet(c.Keys, k.log)
	}
	if err != nil {
		k.log.Warn("bearer tokens: ignoring the cached key set", "file", k.cache, "err", err)
		return
	}
	k.mu.Lock()
	k.set, k.fetched = set, c.Fetched
	k.mu.Unlock()
	k.log.Info("bearer tokens: issuer's cached key set loaded", "file", k.cache, "keys", len(set), "fetched", c.Fetched.UTC().Format(time.RFC3339))
}

// lookup returns the key kid names, refetching the set if it does not
// hold it (or holds none, or is older than Refresh) and the last attempt
// is at least MinRefetch old.
func (k *keys) lookup(ctx context.Context, kid string) (jose.JSONWebKey, error) {
	key, ok, stale := k.get(kid)
	if ok && !stale {
		return key, nil
	}
	// Never fetched and not due: a fetch is under way (the first, as the
	// gateway starts). refresh waits for it (bounded by its timeout) and
	// then does not fetch again, rather than every job that joins in the
	// gateway's first moments being refused.
	if k.due() || k.neverFetched() {
		k.refresh(ctx, false)
		key, ok, stale = k.get(kid)
	}
	k.mu.Lock()
	fetched, lastErr := k.fetched, k.lastErr
	k.mu.Unlock()
	switch {
	case ok && k.cfg.Now().Sub(fetched) <= k.cfg.MaxStale:
		return key, nil
	case fetched.IsZero():
		return jose.JSONWebKey{}, fmt.Errorf("%w: the keys of issuer %s were never fetched (%v); retry later", ErrUnavailable, k.iss.URL, lastErr)
	case ok:
		return jose.JSONWebKey{}, fmt.Errorf("%w: the keys of issuer %s are from %s, older than the %s the gateway uses them for (last fetch: %v)", ErrUnavailable, k.iss.URL, fetched.UTC().Format(time.RFC3339), k.cfg.MaxStale, lastErr)
	case lastErr != nil:
		return jose.JSONWebKey{}, fmt.Errorf("%w: issuer %s has no key %q that the gateway knows, and its keys cannot be fetched now (%v)", ErrUnavailable, k.iss.URL, kid, lastErr)
	}
	return jose.JSONWebKey{}, fmt.Errorf("%w: issuer %s has no key %q (forged token, or a key the issuer withdrew)", ErrRefused, k.iss.URL, kid)
}

// neverFetched reports whether no key set was ever fetched or cached.
func (k *keys) neverFetched() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.fetched.IsZero()
}

// get returns the key kid, and whether the set is older than Refresh.
func (k *keys) get(kid string) (key jose.JSONWebKey, ok, stale bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	key, ok = k.set[kid]
	return key, ok, k.cfg.Now().Sub(k.fetched) > k.cfg.Refresh
}

// due reports whether a fetch may start now (MinRefetch since the last).
func (k *keys) due() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tried.IsZero() || k.cfg.Now().Sub(k.tried) >= k.cfg.MinRefetch
}

// refresh fetches the key set (if force, or if no other fetch happened
// meanwhile within MinRefetch) and keeps it; on failure the old set
// stays.
func (k *keys) refresh(ctx context.Context, force bool) {
	k.fetchMu.Lock()
	defer k.fetchMu.Unlock()
	if !force && !k.due() {
		return // another caller fetched while this one waited
	}
	now := k.cfg.Now()
	k.mu.Lock()
	k.tried = now
	k.mu.Unlock()
	uri, raw, set, err := k.fetch(ctx)
	k.mu.Lock()
	k.lastErr = err
	if err == nil {
		k.set, k.fetched = set, now
	}
	k.mu.Unlock()
	if err != nil {
		k.log.Warn("bearer tokens: cannot fetch the issuer's keys; the last ones stay in use", "err", err)
		return
	}
	k.log.Debug("bearer tokens: issuer's keys fetched", "jwks_uri", uri, "keys", len(set))
	if k.cache == "" {
		return
	}
	b, _ := json.Marshal(cached{Issuer: k.iss.URL, JWKSURI: uri, Fetched: now, Keys: raw})
	if err := statefile.WriteAtomic(k.cache, b, 0o600); err != nil {
		k.log.Warn("bearer tokens: cannot keep the issuer's keys on disk", "err", err)
	}
}

// fetch reads the discovery document and the key set it names.
func (k *keys) fetch(ctx context.Context) (jwksURI string, raw json.RawMessage, set map[string]jose.JSONWebKey, err error) {
	var disc struct {
		Issuer  string `json:"issuer"`
		JWKSURI string `json:"jwks_uri"`
	}
	wellKnown := strings.TrimSuffix(k.iss.URL, "/") + "/.well-known/openid-configuration"
	if err := k.getJSON(ctx, wellKnown, &disc); err != nil {
		return "", nil, nil, err
	}
	if disc.Issuer != k.iss.URL {
		return "", nil, nil, fmt.Errorf("%s: issuer %q, not %q: the url of [[issuer]] must be the issuer's own (as its tokens' \"iss\")", wellKnown, disc.Issuer, k.iss.URL)
	}
	if u, err := url.Parse(disc.JWKSURI); err != nil || u.Scheme != "https" || u.Host == "" {
		return "", nil, nil, fmt.Errorf("%s: jwks_uri %q: want an https URL", wellKnown, disc.JWKSURI)
	}
	var doc struct {
		Keys json.RawMessage `json:"keys"`
	}
	if err := k.getJSON(ctx, disc.JWKSURI, &doc); err != nil {
		return "", nil, nil, err
	}
	set, err = parseKeySet(doc.Keys, k.log)
	if err != nil {
		return "", nil, nil, fmt.Errorf("%s: %w", disc.JWKSURI, err)
	}
	return disc.JWKSURI, doc.Keys, set, nil
}

func (k *keys) getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fmt.Errorf("get %s: %w", u, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.client.Do(req)
	if err != nil {
		return fmt.Errorf("get %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("get %s: %s", u, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxDocument+1))
	if err != nil {
		return fmt.Errorf("get %s: %w", u, err)
	}
	if len(b) > maxDocument {
		return fmt.Errorf("get %s: larger than %d KiB", u, maxDocument>>10)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("get %s: %w", u, err)
	}
	return nil
}

// parseKeySet reads a JWKS "keys" array: public signing keys with a kid.
// Keys of other uses or unknown types are skipped (an issuer may publish
// kinds this gateway cannot use); private key material is refused.
func parseKeySet(raw json.RawMessage, log *slog.Logger) (map[string]jose.JSONWebKey, error) {
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("key set: %w", err)
	}
	set := make(map[string]jose.JSONWebKey, len(list))
	for i, r := range list {
		var key jose.JSONWebKey
		if err := key.UnmarshalJSON(r); err != nil {
			log.Debug("bearer tokens: skipping a key the gateway cannot read", "index", i, "err", err)
			continue
		}
		switch {
		case !key.IsPublic():
			return nil, fmt.Errorf("key %d (%q) holds private key material: refusing the set", i, key.KeyID)
		case key.Use != "" && key.Use != "sig", key.KeyID == "", !key.Valid():
			continue
		}
		if _, dup := set[key.KeyID]; dup {
			return nil, fmt.Errorf("kid %q twice in the set", key.KeyID)
		}
		set[key.KeyID] = key
	}
	if len(set) == 0 {
		return nil, errors.New("key set holds no public signing key with a kid")
	}
	return set, nil
}
