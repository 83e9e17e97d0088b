// SPDX-License-Identifier: MIT

package config

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/airlock-vpn/airlock/internal/bearer"
	"github.com/airlock-vpn/airlock/internal/jointoken"
)

// Bearer is a config's identity from bearer tokens ([[issuer]] and
// [bearer]): the token issuers the gateway trusts and how it keeps their
// keys (internal/bearer).
type Bearer struct {
	// Issuers are the trusted issuers, in the file's order.
	Issuers []Issuer
	// Required refuses joins without a valid bearer token.
	Required bool
	// Refresh, MinRefetch, MaxStale and Leeway are bearer.Config's (0:
	// its defaults).
	Refresh, MinRefetch, MaxStale, Leeway time.Duration
}

// Issuer is one [[issuer]]: what bearer verifies, and the names its jobs
// are accounted under.
type Issuer struct {
	bearer.Issuer
	// Map names the jobs of some subjects or groups differently from
	// Name (the first entry that matches).
	Map []IssuerMap
}

// IssuerMap is one [[issuer.map]]: jobs whose token has Subject (or is
// in Group) are accounted under As, a name policy rules, limits and
// quotas use as they use a token name.
type IssuerMap struct {
	Subject, Group, As string
}

// As returns the name a job of i with subject sub and groups is
// accounted under.
func (i Issuer) As(sub string, groups []string) string {
	for _, m := range i.Map {
		if m.Subject != "" && m.Subject == sub {
			return m.As
		}
		if m.Group != "" {
			for _, g := range groups {
				if g == m.Group {
					return m.As
				}
			}
		}
	}
	return i.Name
}

type fileIssuer struct {
	Name     string          `toml:"name"`
	URL      string          `toml:"url"`
	Audience []string        `toml:"audience"`
	Scopes   []string        `toml:"scopes"`
	Groups   []string        `toml:"groups"`
	CAFile   string          `toml:"ca_file"`
	Map      []fileIssuerMap `toml:"map"`
}

type fileIssuerMap struct {
	Subject string `toml:"subject"`
	Group   string `toml:"group"`
	As      string `toml:"as"`
}

type fileBearer struct {
	Required   bool   `toml:"required"`
	Refresh    string `toml:"refresh"`
	MinRefetch string `toml:"min_refetch"`
	MaxStale   string `toml:"max_stale"`
	Leeway     string `toml:"leeway"`
}

// resolveBearer checks [[issuer]] and [bearer].
func (d *file) resolveBearer(bad func(string, string, ...any)) Bearer {
	var b Bearer
	urls := map[string]int{}
	for i, fi := range d.Issuer {
		key := fmt.Sprintf("issuer[%d]", i+1)
		is := Issuer{Issuer: bearer.Issuer{Name: fi.Name, URL: fi.URL, Audiences: fi.Audience, Scopes: fi.Scopes, Groups: fi.Groups, CAFile: fi.CAFile}}
		if fi.Name == "" {
			bad(key, "no name: want name = \"NAME\", the name policy rules, limits and quotas give the issuer's jobs (as a token name)")
		} else if err := jointoken.ValidateName(fi.Name); err != nil {
			bad(key+".name", "%v", err)
		}
		if err := is.Validate(); err != nil {
			bad(key, "%v", err)
		}
		if j, dup := urls[fi.URL]; dup && fi.URL != "" {
			bad(key+".url", "%q is also the url of issuer[%d]", fi.URL, j)
		}
		urls[fi.URL] = i + 1
		if fi.CAFile != "" && !filepath.IsAbs(fi.CAFile) {
			bad(key+".ca_file", "%q: want an absolute path", fi.CAFile)
		}
		for j, m := range fi.Map {
			mkey := fmt.Sprintf("%s.map[%d]", key, j+1)
			if (m.Subject == "") == (m.Group == "") {
				bad(mkey, "want one of subject or group")
			}
			if err := jointoken.ValidateName(m.As); err != nil {
				bad(mkey+".as", "%v", err)
			}
			is.Map = append(is.Map, IssuerMap{Subject: m.Subject, Group: m.Group, As: m.As})
		}
		b.Issuers = append(b.Issuers, is)
	}
	if d.Bearer == nil {
		return b
	}
	b.Required = d.Bearer.Required
	if b.Required && len(b.Issuers) == 0 {
		bad("bearer.required", "true without an [[issuer]]: a gateway that trusts no issuer cannot require tokens")
	}
	for _, f := range []struct {
		key string
		s   string
		d   *time.Duration
	}{{"bearer.refresh", d.Bearer.Refresh, &b.Refresh}, {"bearer.min_refetch", d.Bearer.MinRefetch, &b.MinRefetch}, {"bearer.max_stale", d.Bearer.MaxStale, &b.MaxStale}, {"bearer.leeway", d.Bearer.Leeway, &b.Leeway}} {
		if f.s == "" {
			continue
		}
		v, err := time.ParseDuration(f.s)
		if err != nil || v <= 0 {
			bad(f.key, "%q: want a positive duration (\"30s\", \"1h\")", f.s)
			continue
		}
		*f.d = v
	}
	return b
}
