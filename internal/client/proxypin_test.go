// SPDX-License-Identifier: MIT

package client

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
	"github.com/airlock-vpn/airlock/internal/siteproxy"
)

// A site proxy that hands the job's CONNECT to another host than the one
// asked for (an impostor with its own certificate, as an intercepting
// proxy is) does not get the control API: the pin is checked end to end,
// through the tunnel. The same proxy passing the connection to the real
// gateway works, so the refusal is the pin's.
func TestProxyCannotImpersonateGateway(t *testing.T) {
	real := controltest.Start(t, nil, controltest.Options{})
	impostor := controltest.Start(t, nil, controltest.Options{})
	for _, tc := range []struct {
		name, upstream string
		want           error
	}{{"impostor", impostor.Addr, control.ErrPinMismatch}, {"honest", real.Addr, nil}} {
		t.Run(tc.name, func(t *testing.T) {
			proxy := connectTo(t, tc.upstream)
			getenv := func(k string) string {
				if k == "HTTPS_PROXY" {
					return "http://" + proxy
				}
				return ""
			}
			// Direct TCP fails before a packet leaves (the gateway's
			// address is TEST-NET-1): the proxy is the way.
			direct := &net.Dialer{Control: func(_, addr string, _ syscall.RawConn) error {
				if ap, err := netip.ParseAddrPort(addr); err != nil || !ap.Addr().IsLoopback() {
					return errors.New("no direct route here")
				}
				return nil
			}}
			d := siteproxy.NewDialer(siteproxy.FromEnv(getenv), direct, 0, nil)
			c, err := control.NewClient("192.0.2.1:8443", real.Pin, 10*time.Second, control.WithDial(d.DialContext))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_, err = c.Health(context.Background())
			if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Fatalf("health through a proxy that connects to the %s gateway: %v, want %v", tc.name, err, tc.want)
			}
		})
	}
}

// connectTo is a web proxy on loopback that answers every CONNECT by
// connecting to upstream, whatever the request names.
func connectTo(t *testing.T, upstream string) string {
	t.Helper()
	return proxytest.TCPServer(t, func(c net.Conn) {
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		up, err := net.Dial("tcp", upstream)
		if err != nil {
			return
		}
		defer up.Close()
		_, _ = io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
		go func() { _, _ = io.Copy(up, c) }()
		_, _ = io.Copy(c, up)
	}).String()
}
