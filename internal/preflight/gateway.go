// SPDX-License-Identifier: MIT

package preflight

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/siteproxy"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/version"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Timeouts of the network checks.
const (
	controlTimeout   = 5 * time.Second
	handshakeTimeout = 5 * time.Second
)

// Gateway checks one gateway (HOST:PORT) from this node: the pin's syntax,
// TCP to the control port with TLS and the pin (the unauthenticated
// health request), and, with a token, a real join and a WireGuard
// handshake over UDP, releasing the lease at once. udpMiss is the verdict
// when UDP does not get through (Warn where the TCP transport may carry
// the job). dial reaches the control port as airlock run does (directly
// or through the site's web proxy); the report says which way and why.
func Gateway(ctx context.Context, gw, pin, token string, udpMiss Status, dial *siteproxy.Dialer) []Result {
	name := "gateway " + gw
	c, err := control.NewClient(gw, pin, controlTimeout, control.WithDial(dial.DialContext))
	if err != nil {
		return []Result{{Name: name + " pin", Status: Problem, Detail: err.Error(),
			Fix: "set AIRLOCK_GATEWAY and AIRLOCK_PIN from the gateway's join.env"}}
	}
	defer c.Close()
	h, err := c.Health(ctx)
	switch {
	case errors.Is(err, control.ErrPinMismatch):
		return []Result{{Name: name + " pin", Status: Problem, Detail: err.Error(),
			Fix: "copy AIRLOCK_PIN from the gateway's join.env (a gateway whose state directory was recreated has a new pin); if it is unchanged, something else answers on this address"}}
	case err != nil:
		return []Result{{Name: name + " TCP", Status: Problem, Detail: err.Error(), Fix: tcpFix(gw, err, dial.Env())}}
	}
	out := []Result{{Name: name + " TCP", Status: OK,
		Detail: fmt.Sprintf("control API answers over TLS with the pinned certificate (%d jobs%s)", h.Jobs, map[bool]string{true: ", draining", false: ""}[h.Draining])}}
	if h.Draining {
		out[0].Status, out[0].Fix = Warn, "the gateway refuses new jobs until airlock gateway drain --undo or a restart"
	}
	if p, ok := dial.Path(gw); ok {
		r := Result{Name: name + " path", Status: OK, Detail: p.String()}
		if p.Proxy != "" {
			r.Detail += "; jobs run on the TCP/TLS transport through it (UDP does not pass an HTTP proxy), end to end TLS with the pin"
		}
		out = append(out, r)
	}
	if token == "" {
		return append(out, Result{Name: name + " UDP", Status: Warn, Detail: "not checked: no join token",
			Fix: "give --token-file FILE (or AIRLOCK_TOKEN_FILE, AIRLOCK_TOKEN) to check the join and UDP"})
	}
	return append(out, udpCheck(ctx, c, name, token, udpMiss))
}

// udpCheck joins with token and waits for a WireGuard handshake over UDP.
func udpCheck(ctx context.Context, c *control.Client, name, token string, udpMiss Status) Result {
	priv, err := wgkey.Generate()
	if err != nil {
		return Result{Name: name + " join", Status: Problem, Detail: err.Error()}
	}
	host, _ := os.Hostname()
	lease, err := c.Join(ctx, control.JoinRequest{Token: token, PublicKey: priv.PublicKey(),
		Job: control.JobInfo{UID: os.Getuid(), Hostname: host, Command: "airlock-check"}, Version: version.Get().Version})
	if err != nil {
		fix := "check the gateway's log"
		if errors.Is(err, control.ErrBadToken) {
			fix = "make a token on the gateway (airlock token create) and set AIRLOCK_TOKEN"
		}
		return Result{Name: name + " join", Status: Problem, Detail: err.Error(), Fix: fix}
	}
	defer c.Release(context.WithoutCancel(ctx), control.LeaseRef{ID: lease.ID, Secret: lease.Secret})
	r := Result{Name: name + " UDP", Status: udpMiss}
	gwKey := lease.GatewayPublicKey // validated by control.Client.Join
	ep, err := client.ResolveEndpoint(ctx, lease.Endpoint, c.Gateway())
	if err != nil {
		r.Status, r.Detail = Problem, err.Error()
		return r
	}
	dev := newNullTUN(lease.MTU)
	wg, err := tunnel.NewClient(slog.New(slog.NewTextHandler(io.Discard, nil)), dev, nil, priv, gwKey, ep)
	if err != nil {
		r.Status, r.Detail = Problem, err.Error()
		return r
	}
	defer wg.Close()
	start := time.Now()
	for wg.LastHandshake().IsZero() && time.Since(start) < handshakeTimeout && ctx.Err() == nil {
		time.Sleep(20 * time.Millisecond)
	}
	if wg.LastHandshake().IsZero() {
		r.Detail = fmt.Sprintf("joined, but no WireGuard handshake with %v within %v: UDP is blocked on the way; jobs fall back to the slower TCP transport (--transport auto)", ep, handshakeTimeout)
		r.Fix = fmt.Sprintf("open UDP %d from the compute nodes to the gateway", ep.Port())
		return r
	}
	return Result{Name: r.Name, Status: OK, Detail: fmt.Sprintf("joined (lease %s, released) and WireGuard handshake with %v in %v", lease.ID, ep, time.Since(start).Round(time.Millisecond))}
}

// tcpFix is the fix for a control port that could not be reached.
func tcpFix(gw string, err error, env *siteproxy.Env) string {
	port := portOf(gw)
	switch {
	case errors.Is(err, siteproxy.ErrForbidden):
		return "ask the site to let its web proxy CONNECT to " + gw + " (squid: add port " + port + " to the SSL_ports ACL), or run the gateway on port 443"
	case errors.Is(err, siteproxy.ErrAuth):
		return "give the proxy's credentials in HTTPS_PROXY (http://USER:PASSWORD@HOST:PORT), " + siteproxy.AuthFileEnv + " or ~/.netrc"
	case env.Configured():
		return "open TCP " + port + " from the compute nodes to the gateway or check HTTPS_PROXY (" + env.String() + ") and NO_PROXY, and check that the gateway runs (airlock status on the gateway)"
	}
	return "open TCP " + port + " from the compute nodes to the gateway, and check that it runs (airlock status on the gateway); a site whose nodes reach the outside only through a web proxy: set HTTPS_PROXY"
}

func portOf(hostport string) string {
	_, p, _ := net.SplitHostPort(hostport)
	return p
}

// nullTUN is a tun.Device that never delivers a packet and discards what
// it is given: enough for a WireGuard handshake.
type nullTUN struct {
	mtu    int
	events chan tun.Event
	closed chan struct{}
}

func newNullTUN(mtu int) *nullTUN {
	if mtu <= 0 {
		mtu = 1420
	}
	t := &nullTUN{mtu: mtu, events: make(chan tun.Event, 1), closed: make(chan struct{})}
	t.events <- tun.EventUp
	return t
}

func (t *nullTUN) File() *os.File { return nil }

func (t *nullTUN) Read([][]byte, []int, int) (int, error) {
	<-t.closed
	return 0, os.ErrClosed
}

func (t *nullTUN) Write(bufs [][]byte, _ int) (int, error) { return len(bufs), nil }
func (t *nullTUN) MTU() (int, error)                       { return t.mtu, nil }
func (t *nullTUN) Name() (string, error)                   { return "airlock-check", nil }
func (t *nullTUN) Events() <-chan tun.Event                { return t.events }
func (t *nullTUN) BatchSize() int                          { return 1 }

func (t *nullTUN) Close() error {
	select {
	case <-t.closed:
	default:
		close(t.closed)
		close(t.events)
	}
	return nil
}
