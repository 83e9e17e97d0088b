// SPDX-License-Identifier: MIT

package bypass

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/policy"
)

// ErrNotBypassed is returned by Engine.Dial for a destination no entry
// matches: the caller sends the flow through the gateway.
var ErrNotBypassed = errors.New("not a bypass destination")

// ErrDenied is wrapped by Engine.Dial's error for a destination an entry
// matches but the gateway's policy denies.
var ErrDenied = errors.New("denied by the gateway's policy")

// DialTimeout bounds dialling a bypassed destination.
const DialTimeout = 10 * time.Second

// Engine is a client's bypass: the Set in force, the counters, and the
// dialler of bypassed flows. It is safe for concurrent use; create it with
// NewEngine. A nil *Engine bypasses nothing: Update, Set, Report and Dial
// work on it.
type Engine struct {
	log      *slog.Logger
	set      atomic.Pointer[Set]
	counters Counters
	dialer   net.Dialer
	// dialHost, if set, replaces dialer.DialContext (tests).
	dialHost func(ctx context.Context, network, address string) (net.Conn, error)
}

// NewEngine returns an engine that bypasses nothing until Update.
func NewEngine(log *slog.Logger) *Engine {
	e := &Engine{log: log, dialer: net.Dialer{Timeout: DialTimeout, KeepAlive: 30 * time.Second}}
	e.set.Store(&Set{entries: &policy.Policy{Default: policy.Deny}, gateway: &policy.Policy{}})
	return e
}

// Update puts the bypass b from the gateway in force for new flows (flows
// already open are left alone; the netns mode's Device reads the set in
// force for each packet and Dial for each flow). A b that does not compile leaves the old
// one in force.
func (e *Engine) Update(b *control.Bypass) error {
	if e == nil {
		return nil
	}
	s, err := Compile(b)
	if err != nil {
		return err
	}
	old := e.set.Swap(s)
	if !old.IsEmpty() || !s.IsEmpty() {
		e.log.Info("site-local bypass in force", "entries", s.Rules(), "local_domains", s.domains, "resolvers", s.resolvers)
	}
	return nil
}

// Set returns the set in force.
func (e *Engine) Set() *Set {
	if e == nil {
		return nil
	}
	return e.set.Load()
}

// Report returns the counters to send with a renewal.
func (e *Engine) Report() []control.BypassCount {
	if e == nil {
		return nil
	}
	return e.counters.Snapshot()
}

// Dial opens a host socket for a job's flow to dst (network "tcp", "tcp4",
// "tcp6", "udp", "udp4" or "udp6") if an entry bypasses it: ErrNotBypassed
// if none does, an error wrapping ErrDenied if the gateway's policy denies
// it. The connection counts its bytes under the entry, and the flow is
// counted once dialled.
func (e *Engine) Dial(ctx context.Context, network string, dst netip.AddrPort) (net.Conn, error) {
	proto := policy.ProtoTCP
	if len(network) >= 3 && network[:3] == "udp" {
		proto = policy.ProtoUDP
	}
	s := e.Set()
	rule, ok := s.Match(proto, dst.Addr(), dst.Port())
	if !ok {
		return nil, ErrNotBypassed
	}
	if v := s.Allowed(proto, dst.Addr(), dst.Port(), false); v.Action != policy.Allow {
		return nil, fmt.Errorf("%s %s (bypass entry %s, policy rule %s): %w", proto, dst, rule, v.Rule, ErrDenied)
	}
	dial := e.dialer.DialContext
	if e.dialHost != nil {
		dial = e.dialHost
	}
	c, err := dial(ctx, network, dst.String())
	if err != nil {
		return nil, err
	}
	n := e.counters.rule(rule)
	n.flows.Add(1)
	return &countConn{Conn: c, n: n}, nil
}

// LookupHost resolves a name in a local domain through the site
// resolvers, from the node: its IPv4 addresses, then its IPv6 ones. ok is
// false for other names.
func (e *Engine) LookupHost(ctx context.Context, name string) (addrs []netip.Addr, ok bool, err error) {
	s := e.Set()
	if !s.IsLocal(name) {
		return nil, false, nil
	}
	r := e.resolver(s)
	ips, err := r.LookupNetIP(ctx, "ip", name)
	if err != nil {
		return nil, true, err
	}
	for _, a := range ips {
		addrs = append(addrs, a.Unmap())
	}
	// IPv4 first: a client that takes the first address keeps working
	// on a node without IPv6.
	slices.SortStableFunc(addrs, func(a, b netip.Addr) int { return cmp.Compare(ipfamily.Of(a).Index, ipfamily.Of(b).Index) })
	return addrs, true, nil
}

// resolver is a Go resolver that asks s's site resolvers in turn.
func (e *Engine) resolver(s *Set) *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var last error
		for _, r := range s.resolvers {
			c, err := e.dialer.DialContext(ctx, network, r.String())
			if err == nil {
				return c, nil
			}
			last = err
		}
		if last == nil {
			last = errors.New("no site resolver")
		}
		return nil, last
	}}
}
