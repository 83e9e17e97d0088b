// SPDX-License-Identifier: MIT

package siteproxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"
)

// DefaultDirectTimeout is how long a Dialer waits for a direct connection
// before it tries the proxy: a site that drops (not refuses) packets to
// the outside answers nothing, and a job should not wait a TCP timeout.
const DefaultDirectTimeout = 3 * time.Second

// maxRemembered bounds the gateways whose way a Dialer remembers (a
// client knows at most a fleet's 64).
const maxRemembered = 256

// Path is how a Dialer last reached a gateway.
type Path struct {
	// Proxy is the proxy's redacted URL; "" means direct.
	Proxy string
	// Why says why this path was taken, for logs and --check.
	Why string
}

func (p Path) String() string {
	if p.Proxy == "" {
		return "direct: " + p.Why
	}
	return "through the site's web proxy " + p.Proxy + ": " + p.Why
}

// Dialer dials gateways directly or through the site's web proxy (see the
// package comment). Make it with NewDialer; it is safe for concurrent
// use.
type Dialer struct {
	env           *Env
	direct        *net.Dialer
	directTimeout time.Duration
	log           *slog.Logger

	mu    sync.Mutex
	paths map[string]Path // guarded by mu: by target, the way that last worked
}

// NewDialer returns a Dialer that dials with direct (its Timeout bounds
// each attempt) and uses the proxy env names. directTimeout bounds the
// direct attempt when a proxy could be tried instead (0: the default).
// log may be nil.
func NewDialer(env *Env, direct *net.Dialer, directTimeout time.Duration, log *slog.Logger) *Dialer {
	if directTimeout <= 0 {
		directTimeout = DefaultDirectTimeout
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if env == nil {
		env = &Env{}
	}
	return &Dialer{env: env, direct: direct, directTimeout: directTimeout, log: log, paths: map[string]Path{}}
}

// Env returns the proxy environment the Dialer uses.
func (d *Dialer) Env() *Env { return d.env }

// Path returns how target was last reached; ok is false before a
// connection to it succeeded.
func (d *Dialer) Path(target string) (p Path, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, ok = d.paths[target]
	return p, ok
}

func (d *Dialer) remember(target string, p Path) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, had := d.paths[target]
	if !had && len(d.paths) >= maxRemembered {
		clear(d.paths)
	}
	d.paths[target] = p
	if !had || old.Proxy != p.Proxy {
		d.log.Info("way to the gateway", "gateway", target, "path", p.String())
	}
}

// DialContext connects to addr (HOST:PORT of a gateway's control port);
// network must be a TCP one. Without a proxy for addr it is the direct
// dialer's DialContext. With one, it tries the way that last worked
// first and the other one second; an error names both attempts.
func (d *Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	proxy, perr := d.env.For(addr)
	if proxy == nil && perr == nil {
		c, err := d.direct.DialContext(ctx, network, addr)
		if err == nil {
			d.remember(addr, Path{Why: d.noProxyWhy()})
		}
		return c, err
	}
	viaProxy := func() (net.Conn, error) {
		if perr != nil {
			return nil, perr
		}
		creds, err := d.env.credentials(proxy)
		if err != nil {
			return nil, err
		}
		return Connect(ctx, d.direct, proxy, creds, addr)
	}
	direct := func() (net.Conn, error) {
		dctx, cancel := context.WithTimeout(ctx, d.directTimeout)
		defer cancel()
		c, err := d.direct.DialContext(dctx, network, addr)
		if err != nil && ctx.Err() == nil && dctx.Err() != nil {
			err = fmt.Errorf("no connection within %v", d.directTimeout)
		}
		return c, err
	}
	if last, ok := d.Path(addr); ok && last.Proxy != "" {
		c, err := viaProxy()
		if err == nil {
			return c, nil
		}
		c, derr := direct()
		if derr == nil {
			d.remember(addr, Path{Why: "the site's web proxy failed (" + err.Error() + ")"})
			return c, nil
		}
		return nil, fmt.Errorf("through the site's web proxy: %w; direct: %v", err, derr)
	}
	c, derr := direct()
	if derr == nil {
		d.remember(addr, Path{Why: "direct TCP connects (HTTPS_PROXY " + d.env.String() + " not needed)"})
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, derr
	}
	c, err := viaProxy()
	if err != nil {
		return nil, &bothError{direct: derr, proxy: err}
	}
	d.remember(addr, Path{Proxy: proxy.Redacted(), Why: "direct TCP failed (" + derr.Error() + ")"})
	return c, nil
}

func (d *Dialer) noProxyWhy() string {
	if d.env.Configured() {
		return "NO_PROXY exempts the gateway"
	}
	return "no HTTPS_PROXY"
}

// bothError is a failure of both ways; it unwraps to the proxy's error
// (the one with a fix when direct TCP is not meant to work) and to the
// direct one.
type bothError struct{ direct, proxy error }

func (e *bothError) Error() string {
	return fmt.Sprintf("direct: %v; through the site's web proxy: %v", e.direct, e.proxy)
}

func (e *bothError) Unwrap() []error { return []error{e.proxy, e.direct} }

// IsRefusal reports whether err holds a proxy's definite refusal (403 or
// 407), which waiting does not fix.
func IsRefusal(err error) bool {
	return errors.Is(err, ErrForbidden) || errors.Is(err, ErrAuth)
}
