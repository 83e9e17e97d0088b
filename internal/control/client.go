// SPDX-License-Identifier: MIT

package control

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// clientIdleTimeout is how long the client keeps an idle connection for
// the next renewal. It is below the server's DefaultIdleTimeout so that the
// client, not the server, normally closes idle connections.
const clientIdleTimeout = 2 * time.Minute

// maxResponseSize bounds response bodies read by the client.
const maxResponseSize = 1 << 20

// Client talks to one gateway's control API over HTTP/1.1 on TLS pinned to
// the gateway's fingerprint, reusing one kept-alive connection across
// requests. It is safe for concurrent use.
type Client struct {
	gateway string
	pin     string // sha256:HEX
	base    string
	http    *http.Client
	// watchHTTP shares http's transport without its per-request timeout,
	// for watches that last as long as the job.
	watchHTTP *http.Client
	dial      DialFunc
	tlsConf   *tls.Config
	timeout   time.Duration
}

// Pin returns the fingerprint the client pins, as sha256:HEX (the form
// of the gateway's join.env and of the payload of a MUNGE join
// credential).
func (c *Client) Pin() string { return c.pin }

// DialFunc opens a TCP connection to a gateway's control port (HOST:PORT),
// as net.Dialer.DialContext does; the client runs TLS over it.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ClientOption changes a Client made by NewClient.
type ClientOption func(*clientOptions)

type clientOptions struct{ dial DialFunc }

// WithDial makes the client open its connections (requests and the TCP
// transport) with dial instead of a direct TCP dial, e.g. through the
// site's web proxy (internal/siteproxy). dial must honour the context.
func WithDial(dial DialFunc) ClientOption {
	return func(o *clientOptions) { o.dial = dial }
}

// NewClient returns a client for the gateway at gateway (HOST:PORT) whose
// certificate has fingerprint pin, or one of several (see [ParsePins]). timeout bounds each
// request including connecting; 0 means no bound beyond the context's.
// NewClient does not connect.
func NewClient(gateway string, pin string, timeout time.Duration, opts ...ClientOption) (*Client, error) {
	host, port, err := net.SplitHostPort(gateway)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("invalid gateway address %q: want HOST:PORT; check AIRLOCK_GATEWAY", truncate(gateway, 100))
	}
	ps, err := ParsePins(pin)
	if err != nil {
		return nil, err
	}
	p := strings.Join(ps, "|")
	o := clientOptions{dial: (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext}
	for _, opt := range opts {
		opt(&o)
	}
	tr := &http.Transport{
		// Never net/http's own proxy support: the dial function decides
		// (a site's web proxy through WithDial), and TLS with the pin
		// runs end to end over whatever it returns.
		Proxy:                 nil,
		DialContext:           o.dial,
		TLSClientConfig:       ClientTLSConfig(p),
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		ForceAttemptHTTP2:     false,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{}, // HTTP/1.1 only
		MaxIdleConnsPerHost:   2,
		IdleConnTimeout:       clientIdleTimeout,
		DisableCompression:    true,
	}
	return &Client{
		gateway:   gateway,
		pin:       p,
		base:      "https://" + gateway,
		http:      &http.Client{Transport: tr, Timeout: timeout},
		watchHTTP: &http.Client{Transport: tr},
		dial:      o.dial,
		tlsConf:   tr.TLSClientConfig,
		timeout:   timeout,
	}, nil
}

// Gateway returns the HOST:PORT the client talks to.
func (c *Client) Gateway() string { return c.gateway }

// Close closes idle connections. The client remains usable.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
}

// Join asks the gateway for a lease.
func (c *Client) Join(ctx context.Context, req JoinRequest) (Lease, error) {
	var lease Lease
	err := c.do(ctx, "join", http.MethodPost, PathJoin, req, &lease, false)
	if err == nil && lease.GatewayPublicKey.IsZero() {
		// A present key was validated as it was decoded.
		return Lease{}, fmt.Errorf("join at %s: the gateway's lease has no wireguard key", c.gateway)
	}
	return lease, err
}

// Renew extends a lease.
func (c *Client) Renew(ctx context.Context, ref LeaseRef) (RenewResponse, error) {
	var resp RenewResponse
	err := c.do(ctx, "renew", http.MethodPost, PathRenew, ref, &resp, true)
	return resp, err
}

// Release frees a lease.
func (c *Client) Release(ctx context.Context, ref LeaseRef) error {
	return c.do(ctx, "release", http.MethodPost, PathRelease, ref, nil, true)
}

// Health returns the gateway's load report.
func (c *Client) Health(ctx context.Context) (Health, error) {
	var h Health
	err := c.do(ctx, "health", http.MethodGet, PathHealth, nil, &h, true)
	return h, err
}

// do sends one request. in, if not nil, is sent as JSON; a 2xx response
// body is decoded into out if out is not nil. replayable marks requests
// that may be resent on a fresh connection if the server closed the
// kept-alive one under us.
func (c *Client) do(ctx context.Context, op, method, path string, in, out any, replayable bool) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s: encode request: %w", op, err)
		}
		body = bytes.NewReader(b)
	}
	// connected records whether a TCP connection existed for this
	// request, to tell "unreachable" from later failures.
	var connected atomic.Bool
	trace := &httptrace.ClientTrace{
		ConnectDone: func(_, _ string, err error) {
			if err == nil {
				connected.Store(true)
			}
		},
		GotConn: func(httptrace.GotConnInfo) { connected.Store(true) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), method, c.base+path, body)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if replayable && method == http.MethodPost {
		// Marks the request as safe to retry without sending a header
		// (see net/http.Transport).
		req.Header["Idempotency-Key"] = nil
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return c.transportError(ctx, op, err, connected.Load())
	}
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseSize))
		resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return nil
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, maxResponseSize)).Decode(out); err != nil {
			return fmt.Errorf("%s at %s: decode response: %w", op, c.gateway, err)
		}
		return nil
	}
	return fmt.Errorf("%s at %s: %w", op, c.gateway, readAPIError(resp))
}

func readAPIError(resp *http.Response) *APIError {
	e := &APIError{Status: resp.StatusCode}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var er ErrorResponse
	if json.Unmarshal(b, &er) == nil && er.Code != "" {
		e.Code, e.Message = er.Code, er.Message
	} else {
		e.Message = truncate(strings.TrimSpace(string(b)), 200)
	}
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && n > 0 {
		e.RetryAfter = time.Duration(n) * time.Second
	}
	return e
}

// transportError explains a failed round trip.
func (c *Client) transportError(ctx context.Context, op string, err error, connected bool) error {
	if pe := (*PinMismatchError)(nil); errors.As(err, &pe) {
		return &PinMismatchError{Gateway: c.gateway, Expected: pe.Expected, Presented: pe.Presented}
	}
	cause := err
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		cause = ue.Err
	}
	if errors.Is(err, ErrPinMismatch) {
		return fmt.Errorf("gateway %s: %w", c.gateway, cause)
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("%s at %s: %w", op, c.gateway, ctx.Err())
	}
	if !connected {
		return &unreachableError{gateway: c.gateway, err: cause}
	}
	return fmt.Errorf("%s at %s: %w; check that AIRLOCK_GATEWAY names the gateway's control port", op, c.gateway, cause)
}

// unreachableError reports that no TCP connection to the gateway could be
// made. It matches ErrUnreachable and unwraps to the cause.
type unreachableError struct {
	gateway string
	err     error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach gateway %s over TCP: %v; check AIRLOCK_GATEWAY and that the gateway runs and its port is open from this node", e.gateway, e.err)
}

func (e *unreachableError) Is(target error) bool { return target == ErrUnreachable }

func (e *unreachableError) Unwrap() error { return e.err }
