// SPDX-License-Identifier: MIT

package proxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// HTTP is an HTTP proxy for one job: CONNECT tunnels and plain forward
// requests (absolute URIs), every one authenticated with Proxy-Authorization
// Basic (any username, the job's secret as password). Its zero value is not
// usable; fill the fields and call Serve. It is safe for concurrent use.
type HTTP struct {
	Dialer Dialer
	Secret string
	// Peers admits the local sockets that may connect; nil means
	// OwnerUID of this process's uid (the job's).
	Peers  Peers
	Logger *slog.Logger

	once      sync.Once
	logLimit  *rate.Limiter
	transport *http.Transport
}

func (h *HTTP) init() {
	h.once.Do(func() {
		h.logLimit = rate.NewLimiter(rate.Every(time.Second), 5)
		h.transport = &http.Transport{
			DialContext:           h.dial,
			MaxIdleConnsPerHost:   4,
			IdleConnTimeout:       60 * time.Second,
			ResponseHeaderTimeout: 0,
			DisableCompression:    true, // pass bodies through untouched
			// The defaults (4 KiB) cost a third of the throughput of
			// bulk downloads.
			ReadBufferSize:  256 << 10,
			WriteBufferSize: 64 << 10,
		}
	})
}

// dial resolves through the tunnel and dials through it.
func (h *HTTP) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("bad port %q", port)
	}
	return dialHost(ctx, h.Dialer, host, uint16(p))
}

// Serve serves l until it is closed; it returns nil then.
func (h *HTTP) Serve(ctx context.Context, l net.Listener) error {
	h.init()
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 30 * time.Second,
		// net/http's own complaints (bad requests from clients) go to the
		// debug log, never to the job's stderr.
		ErrorLog:    slog.NewLogLogger(h.Logger.Handler(), slog.LevelDebug),
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	err := srv.Serve(&peerListener{Listener: l, peers: h.Peers, log: h.Logger, limit: h.logLimit})
	h.transport.CloseIdleConnections()
	if errors.Is(err, http.ErrServerClosed) || isClosed(err) {
		return nil
	}
	return err
}

// CloseIdleConnections closes the kept-alive connections to servers that
// no request is using (at the end of a job, so that they do not hold the
// tunnel open).
func (h *HTTP) CloseIdleConnections() {
	h.init()
	h.transport.CloseIdleConnections()
}

func (h *HTTP) authorized(r *http.Request) bool {
	v := r.Header.Get("Proxy-Authorization")
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Basic") {
		return false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return false
	}
	_, pass, ok := strings.Cut(string(b), ":")
	return ok && secretOK(pass, h.Secret)
}

// hopHeaders are removed from forwarded requests and responses (RFC 9110
// 7.6.1).
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// ServeHTTP implements http.Handler.
func (h *HTTP) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.init()
	if !h.authorized(r) {
		w.Header().Set("Proxy-Authenticate", `Basic realm="airlock"`)
		http.Error(w, "airlock proxy: authentication required (use the proxy URL from the job's environment)", http.StatusProxyAuthRequired)
		return
	}
	if r.Method == http.MethodConnect {
		h.connect(w, r)
		return
	}
	if r.URL.Host == "" || r.URL.Scheme != "http" {
		http.Error(w, "airlock proxy: only absolute http:// URIs and CONNECT are proxied", http.StatusBadRequest)
		return
	}
	out := r.Clone(r.Context())
	out.RequestURI = ""
	for _, k := range hopHeaders {
		out.Header.Del(k)
	}
	resp, err := h.transport.RoundTrip(out)
	if err != nil {
		if h.logLimit.Allow() {
			h.Logger.Debug("http proxy", "url", r.URL.Redacted(), "err", err)
		}
		http.Error(w, "airlock proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for _, k := range hopHeaders {
		resp.Header.Del(k)
	}
	for k, vs := range resp.Header {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.CopyBuffer(struct{ io.Writer }{w}, resp.Body, make([]byte, 256<<10))
}

func (h *HTTP) connect(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), DialTimeout)
	rc, err := h.dial(ctx, "tcp", r.Host)
	cancel()
	if err != nil {
		if h.logLimit.Allow() {
			h.Logger.Debug("http proxy connect", "host", r.Host, "err", err)
		}
		http.Error(w, "airlock proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		rc.Close()
		http.Error(w, "airlock proxy: cannot hijack connection", http.StatusInternalServerError)
		return
	}
	c, brw, err := hj.Hijack()
	if err != nil {
		rc.Close()
		return
	}
	if _, err := c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		c.Close()
		rc.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	Splice(&bufferedConn{Conn: c, r: brw.Reader}, rc)
}
