// SPDX-License-Identifier: MIT

package bearer

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Issuer is one token issuer the gateway trusts.
type Issuer struct {
	// Name is the site's name for the issuer's jobs: policy rules,
	// limits and quotas that name a token name apply to them under it.
	Name string
	// URL is the issuer's identifier, exactly as tokens' "iss" spell it
	// (https://...). Discovery reads URL/.well-known/openid-configuration.
	URL string
	// Audiences are the "aud" values accepted; empty: the gateway's
	// advertised names (Config.Audiences).
	Audiences []string
	// Scopes must all be granted by a token's "scope" claim
	// (space-separated). A WLCG scope with a path ("storage.read:/cms")
	// is granted by the same scope for that path or a parent of it.
	Scopes []string
	// Groups, if not empty: a token's "wlcg.groups" must hold one of
	// them.
	Groups []string
	// CAFile names the PEM file of CAs that sign the issuer's TLS
	// certificate; "" means the system's.
	CAFile string
}

// Validate checks i's fields, as a config file's issuer: URL an https URL
// without query or fragment, names printable.
func (i Issuer) Validate() error {
	u, err := url.Parse(i.URL)
	switch {
	case i.URL == "":
		return fmt.Errorf("missing url: want the issuer's https URL, as its tokens' \"iss\" spell it")
	case err != nil:
		return fmt.Errorf("url %q: %w", i.URL, err)
	case u.Scheme != "https" || u.Host == "":
		return fmt.Errorf("url %q: want https://HOST[/PATH] (keys are fetched over verified TLS only)", i.URL)
	case u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return fmt.Errorf("url %q: want no query, fragment or user info", i.URL)
	}
	for _, l := range []struct {
		key string
		v   []string
	}{{"audience", i.Audiences}, {"scopes", i.Scopes}, {"groups", i.Groups}} {
		for _, s := range l.v {
			if s == "" || len(s) > 256 || !printable(s) || strings.ContainsAny(s, " \t") {
				return fmt.Errorf("%s: %q: want a non-empty printable word", l.key, s)
			}
		}
	}
	return nil
}

// Config configures a Verifier.
type Config struct {
	// Issuers are the trusted issuers; URLs must be distinct.
	Issuers []Issuer
	// Audiences are accepted for issuers without their own list: the
	// gateway's advertised names.
	Audiences []string
	// CacheDir is where key sets are kept between starts ("": not kept).
	CacheDir string
	// Refresh is how often an issuer's keys are refetched (default 1 h);
	// MinRefetch the least time between fetches of one issuer (for
	// unknown kids and after a failure; default 1 min); MaxStale the age
	// after which keys the issuer could not refresh are no longer used
	// (default 24 h).
	Refresh, MinRefetch, MaxStale time.Duration
	// Leeway is allowed between the issuer's clock and the gateway's
	// (default 1 min).
	Leeway time.Duration
	// Timeout bounds one fetch (default 10 s).
	Timeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Refresh, time.Hour)
	def(&c.MinRefetch, time.Minute)
	def(&c.MaxStale, 24*time.Hour)
	def(&c.Leeway, time.Minute)
	def(&c.Timeout, 10*time.Second)
	if c.Now == nil {
		c.Now = time.Now
	}
}

// grants reports whether the token's scopes have grants the required
// scope want.
func grants(have []string, want string) bool {
	wantAuthz, wantPath, wantHasPath := strings.Cut(want, ":")
	for _, h := range have {
		if h == want {
			return true
		}
		authz, path, hasPath := strings.Cut(h, ":")
		if !hasPath || !wantHasPath || authz != wantAuthz {
			continue
		}
		// WLCG: a grant for a path covers its descendants.
		if path == "/" || wantPath == path || strings.HasPrefix(wantPath, strings.TrimSuffix(path, "/")+"/") {
			return true
		}
	}
	return false
}

// anyGroup reports whether have holds one of want.
func anyGroup(have, want []string) bool {
	for _, w := range want {
		if slices.Contains(have, w) {
			return true
		}
	}
	return false
}

func printable(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}
