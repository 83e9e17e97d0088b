// SPDX-License-Identifier: MIT

package siteproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/net/http/httpproxy"
)

// AuthFileEnv names a file whose first line is the proxy's USER:PASSWORD,
// for a proxy URL without userinfo.
const AuthFileEnv = "AIRLOCK_PROXY_AUTH_FILE"

// maxAuthFile bounds what is read of a credentials or netrc file.
const maxAuthFile = 64 << 10

// Env is the site's web proxy as the environment names it. Its zero value
// names no proxy. It is safe for concurrent use once made.
type Env struct {
	raw     string // HTTPS_PROXY as given ("" none)
	proxy   func(*url.URL) (*url.URL, error)
	getenv  func(string) string
	badURL  error // HTTPS_PROXY set but unusable
	parsed  *url.URL
	authSrc string // where the credentials come from, for reports
}

// FromEnv reads HTTPS_PROXY (https_proxy), NO_PROXY (no_proxy) and the
// credential sources through getenv (nil: os.Getenv). A proxy variable
// that cannot be used is not an error here: [Env.For] returns it for the
// targets that would have used the proxy, so that a job whose gateway is
// reached directly is not failed by a variable meant for something else.
func FromEnv(getenv func(string) string) *Env {
	if getenv == nil {
		getenv = os.Getenv
	}
	first := func(names ...string) string {
		for _, n := range names {
			if v := getenv(n); v != "" {
				return v
			}
		}
		return ""
	}
	e := &Env{getenv: getenv, raw: first("HTTPS_PROXY", "https_proxy")}
	if e.raw == "" {
		return e
	}
	u, err := parseProxyURL(e.raw)
	if err != nil {
		e.badURL = err
		return e
	}
	e.parsed = u
	e.proxy = (&httpproxy.Config{HTTPSProxy: u.String(), NoProxy: first("NO_PROXY", "no_proxy")}).ProxyFunc()
	return e
}

// parseProxyURL parses a proxy variable as HTTP clients do (a bare
// HOST:PORT means http://HOST:PORT) and accepts only the proxies that
// speak HTTP CONNECT.
func parseProxyURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Host == "" {
		if u2, err2 := url.Parse("http://" + s); err2 == nil && u2.Host != "" {
			u, err = u2, nil
		}
	}
	if err != nil || u.Host == "" {
		return nil, fmt.Errorf("HTTPS_PROXY %q is not a proxy URL: want http://HOST:PORT (optionally http://USER:PASSWORD@HOST:PORT)", redact(s))
	}
	switch u.Scheme {
	case "http", "https":
	default:
		return nil, fmt.Errorf("HTTPS_PROXY %s: scheme %q is not supported: airlock reaches the gateway through an HTTP CONNECT proxy (http:// or https://)", u.Redacted(), u.Scheme)
	}
	if u.Port() == "" {
		u.Host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	return u, nil
}

// redact hides what looks like a password in a string that did not parse
// as a URL.
func redact(s string) string {
	if i := strings.LastIndex(s, "@"); i >= 0 {
		return "***@" + s[i+1:]
	}
	return s
}

// Configured reports whether the environment names a proxy at all.
func (e *Env) Configured() bool { return e != nil && e.raw != "" }

// String is the proxy's URL without its password, or "" for none.
func (e *Env) String() string {
	switch {
	case e == nil || e.raw == "":
		return ""
	case e.parsed == nil:
		return redact(e.raw)
	}
	return e.parsed.Redacted()
}

// For returns the proxy to reach target (HOST:PORT) through: nil, nil when
// no proxy is named or NO_PROXY exempts target (loopback and localhost
// always are); an error when HTTPS_PROXY is set but unusable.
func (e *Env) For(target string) (*url.URL, error) {
	if !e.Configured() {
		return nil, nil
	}
	if e.badURL != nil {
		return nil, e.badURL
	}
	return e.proxy(&url.URL{Scheme: "https", Host: target})
}

// Credentials is a proxy's USER:PASSWORD for Basic authentication and
// where it came from ("" Source: none).
type Credentials struct {
	User, Password string
	// Source says where they came from: "the proxy URL", the file's
	// path.
	Source string
}

// credentials finds the credentials for proxy: the URL's userinfo, else
// AIRLOCK_PROXY_AUTH_FILE, else a netrc entry for the proxy's host. A
// named file that cannot be read is an error (a pilot that names one
// expects it used); an absent ~/.netrc is not.
func (e *Env) credentials(proxy *url.URL) (Credentials, error) {
	if proxy.User != nil {
		p, _ := proxy.User.Password()
		return Credentials{User: proxy.User.Username(), Password: p, Source: "the proxy URL"}, nil
	}
	if f := e.getenv(AuthFileEnv); f != "" {
		b, err := readBounded(f)
		if err != nil {
			return Credentials{}, fmt.Errorf("proxy credentials: %s: %w", AuthFileEnv, err)
		}
		line, _, _ := bytes.Cut(b, []byte("\n"))
		u, p, ok := strings.Cut(strings.TrimSpace(string(line)), ":")
		if !ok || u == "" {
			return Credentials{}, fmt.Errorf("proxy credentials: %s=%s: want one line USER:PASSWORD", AuthFileEnv, f)
		}
		return Credentials{User: u, Password: p, Source: f}, nil
	}
	path, named := e.getenv("NETRC"), true
	if path == "" {
		named = false
		home := e.getenv("HOME")
		if home == "" {
			return Credentials{}, nil
		}
		path = filepath.Join(home, ".netrc")
	}
	b, err := readBounded(path)
	if err != nil {
		if !named && errors.Is(err, os.ErrNotExist) {
			return Credentials{}, nil
		}
		return Credentials{}, fmt.Errorf("proxy credentials: netrc: %w", err)
	}
	if u, p, ok := netrcLookup(b, proxy.Hostname()); ok {
		return Credentials{User: u, Password: p, Source: path}, nil
	}
	return Credentials{}, nil
}

func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, maxAuthFile+1)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if n > maxAuthFile {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxAuthFile)
	}
	return b[:n], nil
}

// netrcLookup returns the login and password netrc gives for host: its
// machine entry, else its default entry.
func netrcLookup(b []byte, host string) (login, password string, ok bool) {
	type entry struct{ login, password string }
	var (
		cur      *entry
		match    *entry
		dflt     *entry
		inMacdef bool
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		if inMacdef {
			inMacdef = strings.TrimSpace(line) != ""
			continue
		}
		f := strings.Fields(line)
		for i := 0; i < len(f); i++ {
			next := func() string {
				if i+1 < len(f) {
					i++
					return f[i]
				}
				return ""
			}
			switch f[i] {
			case "machine":
				cur = &entry{}
				if strings.EqualFold(next(), host) && match == nil {
					match = cur
				}
			case "default":
				cur = &entry{}
				if dflt == nil {
					dflt = cur
				}
			case "login":
				if v := next(); cur != nil {
					cur.login = v
				}
			case "password":
				if v := next(); cur != nil {
					cur.password = v
				}
			case "account":
				next()
			case "macdef":
				inMacdef = true
				i = len(f)
			}
		}
	}
	for _, e := range []*entry{match, dflt} {
		if e != nil && e.login != "" {
			return e.login, e.password, true
		}
	}
	return "", "", false
}
