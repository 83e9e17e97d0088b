// SPDX-License-Identifier: MIT

package siteproxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"time"
)

// Sentinels of a proxy's refusals, matched with errors.Is.
var (
	// ErrForbidden: the proxy refused CONNECT to the gateway (403).
	ErrForbidden = errors.New("the site's web proxy refused CONNECT")
	// ErrAuth: the proxy wants (other) credentials (407).
	ErrAuth = errors.New("the site's web proxy wants credentials")
)

// RefusedError is a proxy's non-2xx answer to CONNECT, with its fix. It
// matches ErrForbidden (403) or ErrAuth (407).
type RefusedError struct {
	Proxy  string // redacted URL
	Target string // HOST:PORT asked for
	Status string // as the proxy sent it
	Code   int
	// CredSource is where the credentials sent came from ("" none sent).
	CredSource string
}

func (e *RefusedError) Error() string {
	_, port, _ := net.SplitHostPort(e.Target)
	switch e.Code {
	case http.StatusForbidden:
		return fmt.Sprintf("the site's web proxy %s refused CONNECT to %s (%s): the proxy must allow CONNECT to the gateway's port %s (squid allows CONNECT only to port 443 by default: the site adds port %s to its SSL_ports ACL, or the gateway listens on 443)",
			e.Proxy, e.Target, e.Status, port, port)
	case http.StatusProxyAuthRequired:
		if e.CredSource == "" {
			return fmt.Sprintf("the site's web proxy %s wants credentials (%s): put them in the proxy URL (HTTPS_PROXY=http://USER:PASSWORD@HOST:PORT), in a file named by %s (one line USER:PASSWORD) or in ~/.netrc (machine PROXYHOST login USER password PASSWORD)",
				e.Proxy, e.Status, AuthFileEnv)
		}
		return fmt.Sprintf("the site's web proxy %s rejected the credentials from %s (%s): check the user and password", e.Proxy, e.CredSource, e.Status)
	}
	return fmt.Sprintf("the site's web proxy %s answered CONNECT to %s with %s", e.Proxy, e.Target, e.Status)
}

// Is matches the sentinel of the refusal's kind.
func (e *RefusedError) Is(target error) bool {
	return (target == ErrForbidden && e.Code == http.StatusForbidden) ||
		(target == ErrAuth && e.Code == http.StatusProxyAuthRequired)
}

// maxConnectHeader bounds the proxy's answer to CONNECT.
const maxConnectHeader = 16 << 10

// Connect opens a TCP connection to target (HOST:PORT) through the proxy
// at proxy with HTTP CONNECT, dialled by d, sending creds if they have a
// user. The connection returned carries target's bytes from its first
// byte on. The context bounds the whole exchange.
func Connect(ctx context.Context, d *net.Dialer, proxy *url.URL, creds Credentials, target string) (net.Conn, error) {
	raw, err := d.DialContext(ctx, "tcp", proxy.Host)
	if err != nil {
		return nil, fmt.Errorf("connect to the site's web proxy %s: %w", proxy.Redacted(), err)
	}
	c := raw
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	fail := func(err error) (net.Conn, error) {
		raw.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, ctx.Err())
		}
		return nil, err
	}
	if proxy.Scheme == "https" {
		tc := tls.Client(raw, &tls.Config{ServerName: proxy.Hostname(), MinVersion: tls.VersionTLS12})
		if err := tc.HandshakeContext(ctx); err != nil {
			return fail(fmt.Errorf("TLS to the site's web proxy %s: %w", proxy.Redacted(), err))
		}
		c = tc
	}
	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: target},
		Host:   target,
		Header: http.Header{"User-Agent": {"airlock"}},
	}
	if creds.User != "" {
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(creds.User+":"+creds.Password)))
	}
	if err := req.Write(c); err != nil {
		return fail(fmt.Errorf("send CONNECT to the site's web proxy %s: %w", proxy.Redacted(), err))
	}
	br := bufio.NewReaderSize(&limitedReader{r: c, n: maxConnectHeader}, 4096)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return fail(fmt.Errorf("read the site's web proxy %s's answer to CONNECT %s: %w", proxy.Redacted(), target, err))
	}
	resp.Body.Close() // a CONNECT answer's body is the tunnel: not read here
	if resp.StatusCode/100 != 2 {
		return fail(&RefusedError{Proxy: proxy.Redacted(), Target: target, Status: resp.Status, Code: resp.StatusCode, CredSource: creds.Source})
	}
	if br.Buffered() > 0 {
		// The proxy may not send the gateway's bytes before our own
		// (the gateway speaks TLS, which the client starts); anything
		// here is a broken proxy.
		return fail(fmt.Errorf("the site's web proxy %s sent %d unexpected bytes after its CONNECT answer", proxy.Redacted(), br.Buffered()))
	}
	return &proxiedConn{c}, nil
}

// limitedReader reads at most n bytes from r, for the CONNECT answer
// only (the tunnel is read from the connection itself afterwards).
type limitedReader struct {
	r net.Conn
	n int
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("answer to CONNECT longer than %d bytes", maxConnectHeader)
	}
	if len(p) > l.n {
		p = p[:l.n]
	}
	// One byte at a time would be exact; bufio asks for up to 4096 and
	// the proxy sends nothing after its answer until we speak, so a
	// full read cannot swallow tunnel bytes.
	n, err := l.r.Read(p)
	l.n -= n
	return n, err
}

// proxiedConn is a connection through the proxy.
type proxiedConn struct{ net.Conn }

// Proxied reports whether c was made through a web proxy by this package.
func Proxied(c net.Conn) bool {
	_, ok := c.(*proxiedConn)
	return ok
}
