// SPDX-License-Identifier: MIT

package siteproxy

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestEnvFor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		target string
		want   string // "" none
		err    string
	}{
		{name: "unset", env: nil, target: "gw.example.org:8443"},
		{name: "upper", env: map[string]string{"HTTPS_PROXY": "http://squid:3128"}, target: "gw.example.org:8443", want: "http://squid:3128"},
		{name: "lower", env: map[string]string{"https_proxy": "squid:3128"}, target: "gw.example.org:8443", want: "http://squid:3128"},
		{name: "no port", env: map[string]string{"HTTPS_PROXY": "http://squid"}, target: "gw.example.org:8443", want: "http://squid:80"},
		{name: "no_proxy domain", env: map[string]string{"HTTPS_PROXY": "squid:3128", "NO_PROXY": ".example.org"}, target: "gw.example.org:8443"},
		{name: "no_proxy cidr", env: map[string]string{"HTTPS_PROXY": "squid:3128", "no_proxy": "10.0.0.0/8"}, target: "10.1.2.3:8443"},
		{name: "no_proxy other", env: map[string]string{"HTTPS_PROXY": "squid:3128", "NO_PROXY": "other.org"}, target: "gw.example.org:8443", want: "http://squid:3128"},
		{name: "loopback", env: map[string]string{"HTTPS_PROXY": "squid:3128"}, target: "127.0.0.1:8443"},
		{name: "socks", env: map[string]string{"HTTPS_PROXY": "socks5://squid:1080"}, target: "gw.example.org:8443", err: "scheme \"socks5\" is not supported"},
		{name: "password redacted", env: map[string]string{"HTTPS_PROXY": "http://u:secret@squid:3128"}, target: "gw.example.org:8443", want: "http://u:xxxxx@squid:3128"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := FromEnv(envOf(tc.env))
			u, err := e.For(tc.target)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if u != nil {
				got = u.Redacted()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCredentials(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	auth := write("auth", "alice:s3cr:et\n")
	bad := write("bad", "no colon here\n")
	netrc := write("netrc", "machine other login x password y\nmacdef init\nmachine squid login evil password evil\n\nmachine squid login bob password pw\ndefault login dflt password dpw\n")
	for _, tc := range []struct {
		name       string
		proxy      string
		env        map[string]string
		user, pass string
		src        string
		err        string
	}{
		{name: "url", proxy: "http://u%40x:p%3Aw@squid:3128", user: "u@x", pass: "p:w", src: "the proxy URL"},
		{name: "file", proxy: "http://squid:3128", env: map[string]string{AuthFileEnv: auth}, user: "alice", pass: "s3cr:et", src: auth},
		{name: "bad file", proxy: "http://squid:3128", env: map[string]string{AuthFileEnv: bad}, err: "want one line USER:PASSWORD"},
		{name: "missing file", proxy: "http://squid:3128", env: map[string]string{AuthFileEnv: filepath.Join(dir, "none")}, err: "no such file"},
		{name: "netrc machine after macdef", proxy: "http://squid:3128", env: map[string]string{"NETRC": netrc}, user: "bob", pass: "pw", src: netrc},
		{name: "netrc default", proxy: "http://elsewhere:3128", env: map[string]string{"NETRC": netrc}, user: "dflt", pass: "dpw", src: netrc},
		{name: "named netrc missing", proxy: "http://squid:3128", env: map[string]string{"NETRC": filepath.Join(dir, "none")}, err: "netrc"},
		{name: "no home netrc", proxy: "http://squid:3128", env: map[string]string{"HOME": dir}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"HTTPS_PROXY": tc.proxy}
			for k, v := range tc.env {
				env[k] = v
			}
			e := FromEnv(envOf(env))
			u, err := e.For("gw.example.org:8443")
			if err != nil {
				t.Fatal(err)
			}
			c, err := e.credentials(u)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got err %v, want one with %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.User != tc.user || c.Password != tc.pass || c.Source != tc.src {
				t.Errorf("got %+v, want %s:%s from %s", c, tc.user, tc.pass, tc.src)
			}
		})
	}
}

// fakeProxy is a CONNECT proxy on loopback that sends every tunnel to
// one echo server, whatever the target, so that tests can name targets
// that direct TCP cannot reach.
type fakeProxy struct {
	ln       net.Listener
	status   int    // answer instead of 200 (0: 200)
	wantAuth string // required Proxy-Authorization ("" none)
	echo     net.Listener
	connects atomic.Int64
	lastHost atomic.Value
}

func newFakeProxy(t *testing.T) *fakeProxy {
	t.Helper()
	p := &fakeProxy{}
	var err error
	if p.ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if p.echo, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ln.Close(); p.echo.Close() })
	go func() {
		for {
			c, err := p.echo.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	go func() {
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *fakeProxy) serve(c net.Conn) {
	defer c.Close()
	req, err := http.ReadRequest(bufio.NewReader(c))
	if err != nil || req.Method != http.MethodConnect {
		io.WriteString(c, "HTTP/1.1 400 Bad Request\r\n\r\n")
		return
	}
	p.connects.Add(1)
	p.lastHost.Store(req.Host)
	if p.wantAuth != "" && req.Header.Get("Proxy-Authorization") != p.wantAuth {
		io.WriteString(c, "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"site\"\r\nContent-Length: 0\r\n\r\n")
		return
	}
	if p.status != 0 {
		io.WriteString(c, "HTTP/1.1 "+strconv.Itoa(p.status)+" "+http.StatusText(p.status)+"\r\nContent-Length: 0\r\n\r\n")
		return
	}
	up, err := net.Dial("tcp", p.echo.Addr().String())
	if err != nil {
		return
	}
	defer up.Close()
	io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
	go io.Copy(up, c)
	io.Copy(c, up)
}

// unreachable is a target that direct TCP cannot reach (TEST-NET-1):
// the direct attempt ends at the Dialer's direct timeout or at once
// (no route).
const unreachable = "192.0.2.1:8443"

func roundTrip(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil || string(b) != "ping" {
		t.Fatalf("echo through the proxy: got %q, %v", b, err)
	}
}

func TestDialerFallsBackToProxyAndRemembers(t *testing.T) {
	p := newFakeProxy(t)
	d := NewDialer(FromEnv(envOf(map[string]string{"HTTPS_PROXY": "http://" + p.ln.Addr().String()})),
		&net.Dialer{Timeout: 5 * time.Second}, 300*time.Millisecond, nil)
	ctx := context.Background()
	if _, ok := d.Path(unreachable); ok {
		t.Fatal("a path before any dial")
	}
	c, err := d.DialContext(ctx, "tcp", unreachable)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, c)
	c.Close()
	if !Proxied(c) {
		t.Error("Proxied: got false for a connection through the proxy")
	}
	if h, _ := p.lastHost.Load().(string); h != unreachable {
		t.Errorf("CONNECT host: got %q, want %q", h, unreachable)
	}
	path, ok := d.Path(unreachable)
	if !ok || path.Proxy == "" || !strings.Contains(path.Why, "direct TCP failed") {
		t.Fatalf("path: got %+v, %v; want through the proxy because direct TCP failed", path, ok)
	}
	// The second dial goes through the proxy first: no direct timeout.
	t0 := time.Now()
	c, err = d.DialContext(ctx, "tcp", unreachable)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if took := time.Since(t0); took > 250*time.Millisecond {
		t.Errorf("second dial took %v: it tried direct TCP again first", took)
	}
	if n := p.connects.Load(); n != 2 {
		t.Errorf("CONNECTs: got %d, want 2", n)
	}
}

func TestDialerDirectWhenItWorks(t *testing.T) {
	p := newFakeProxy(t)
	// NO_PROXY aside, a direct connection that works is used: the proxy
	// is not asked.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	d := NewDialer(FromEnv(envOf(map[string]string{"HTTPS_PROXY": "http://" + p.ln.Addr().String()})), &net.Dialer{}, 0, nil)
	c, err := d.DialContext(context.Background(), "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if Proxied(c) || p.connects.Load() != 0 {
		t.Errorf("loopback target went through the proxy")
	}
	if path, _ := d.Path(ln.Addr().String()); path.Proxy != "" {
		t.Errorf("path: got %+v, want direct", path)
	}
}

func TestRefusals(t *testing.T) {
	basic := func(u, p string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":"+p)) }
	for _, tc := range []struct {
		name     string
		status   int
		wantAuth string
		proxyURL func(addr string) string
		is       error
		msg      []string
		ok       bool
	}{
		{name: "403", status: http.StatusForbidden, is: ErrForbidden, msg: []string{"must allow CONNECT to the gateway's port 8443", "SSL_ports"}},
		{name: "407 none", wantAuth: basic("u", "p"), is: ErrAuth, msg: []string{"wants credentials", AuthFileEnv}},
		{name: "407 wrong", wantAuth: basic("u", "p"), proxyURL: func(a string) string { return "http://u:wrong@" + a }, is: ErrAuth, msg: []string{"rejected the credentials from the proxy URL"}},
		{name: "auth ok", wantAuth: basic("u", "p"), proxyURL: func(a string) string { return "http://u:p@" + a }, ok: true},
		{name: "502", status: http.StatusBadGateway, msg: []string{"answered CONNECT to " + unreachable + " with 502"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newFakeProxy(t)
			p.status, p.wantAuth = tc.status, tc.wantAuth
			u := "http://" + p.ln.Addr().String()
			if tc.proxyURL != nil {
				u = tc.proxyURL(p.ln.Addr().String())
			}
			d := NewDialer(FromEnv(envOf(map[string]string{"HTTPS_PROXY": u})), &net.Dialer{}, 100*time.Millisecond, nil)
			c, err := d.DialContext(context.Background(), "tcp", unreachable)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				roundTrip(t, c)
				c.Close()
				return
			}
			if err == nil {
				c.Close()
				t.Fatal("no error")
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("got %v, want one matching %v", err, tc.is)
			}
			if IsRefusal(err) != (tc.is != nil) {
				t.Errorf("IsRefusal: got %v for %v", IsRefusal(err), err)
			}
			for _, m := range tc.msg {
				if !strings.Contains(err.Error(), m) {
					t.Errorf("got %q, want it to say %q", err, m)
				}
			}
			if strings.Contains(err.Error(), "wrong") {
				t.Errorf("the password is in the error: %v", err)
			}
		})
	}
}

// A proxy (or something posing as one) that answers without end is cut
// off at maxConnectHeader.
func TestConnectAnswerBounded(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		// Read the CONNECT first, as a proxy does: closing with it
		// unread would reset the connection, and the reset could
		// discard the answer before the client read its first 16 KiB.
		if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\n")
		line := "X-Junk: " + strings.Repeat("a", 1000) + "\r\n"
		for i := 0; i < 1000; i++ {
			if _, err := io.WriteString(c, line); err != nil {
				return
			}
		}
		io.Copy(io.Discard, c) // until the client hangs up
	}()
	u, _ := parseProxyURL("http://" + ln.Addr().String())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = Connect(ctx, &net.Dialer{}, u, Credentials{}, unreachable)
	if err == nil || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("got %v, want the answer cut off", err)
	}
}
