// SPDX-License-Identifier: MIT

package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/store"
)

// dialTimeout bounds connecting to the admin socket.
const dialTimeout = 2 * time.Second

// storeLockTimeout is how long the offline token functions wait for the
// state database's lock.
const storeLockTimeout = 500 * time.Millisecond

// Client talks to a running gateway's admin socket. It is safe for
// concurrent use.
type Client struct {
	path string
	http *http.Client
}

// Dial connects to the admin socket of the gateway with state directory
// stateDir. It fails with an error wrapping [ErrNoGateway] if the socket
// does not exist or nobody listens on it.
func Dial(stateDir string) (*Client, error) {
	path := filepath.Join(stateDir, SocketName)
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("admin socket %s: %w", path, ErrNoGateway)
		}
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("connect to admin socket %s: %w; run as the user that runs the gateway", path, err)
		}
		return nil, fmt.Errorf("connect to admin socket %s: %w", path, err)
	}
	c.Close()
	d := &net.Dialer{Timeout: dialTimeout}
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	return &Client{path: path, http: &http.Client{Transport: tr}}, nil
}

// Close closes idle connections.
func (c *Client) Close() error {
	c.http.CloseIdleConnections()
	return nil
}

// CreateToken asks the gateway to make a token; see store.Store.CreateToken.
func (c *Client) CreateToken(ctx context.Context, name string, ttl time.Duration) (string, store.Token, error) {
	req := createTokenRequest{Name: name}
	if ttl != 0 {
		req.TTL = ttl.String()
	}
	var resp createTokenResponse
	if err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &resp); err != nil {
		return "", store.Token{}, fmt.Errorf("create token: %w", err)
	}
	return resp.Secret, resp.Token, nil
}

// Tokens lists the gateway's tokens.
func (c *Client) Tokens(ctx context.Context) ([]store.Token, error) {
	var toks []store.Token
	if err := c.do(ctx, http.MethodGet, "/v1/tokens", nil, &toks); err != nil {
		return nil, fmt.Errorf("list tokens: %w", err)
	}
	return toks, nil
}

// RevokeToken deletes the named token and ends its live leases; the
// error wraps store.ErrNotFound if there is none.
func (c *Client) RevokeToken(ctx context.Context, name string) (RevokeResult, error) {
	var res RevokeResult
	if err := c.do(ctx, http.MethodDelete, "/v1/tokens/"+url.PathEscape(name), nil, &res); err != nil {
		return RevokeResult{}, fmt.Errorf("revoke token: %w", err)
	}
	return res, nil
}

// Do sends one admin request to path (e.g. "/v1/status") with in, if not
// nil, as JSON body and decodes a 2xx JSON answer into out, if not nil.
// It lets admin commands reach endpoints registered with Server.Handle.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	return c.do(ctx, method, path, in, out)
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://airlock"+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("admin socket %s: %w", c.path, ErrNoGateway)
		}
		return fmt.Errorf("admin socket %s: %w", c.path, err)
	}
	defer func() {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out == nil || resp.StatusCode == http.StatusNoContent {
			return nil
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(out); err != nil {
			return fmt.Errorf("decode admin response: %w", err)
		}
		return nil
	}
	return responseError(method, path, resp)
}

// responseError turns a non-2xx answer into an error.
func responseError(method, path string, resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb errorBody
	if json.Unmarshal(b, &eb) != nil || eb.Message == "" {
		eb.Message = fmt.Sprintf("admin request %s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(b)))
	}
	return &remoteError{msg: eb.Message, sentinel: codeSentinel(eb.Code)}
}

// codeSentinel maps an admin error code back to the store sentinel the
// server saw, so that errors.Is behaves as with a local store.
func codeSentinel(code string) error {
	switch code {
	case codeNotFound:
		return store.ErrNotFound
	case codeExists:
		return store.ErrExists
	case codeNotPermitted:
		return store.ErrNotPermitted
	case codeInvalidName:
		return store.ErrInvalidName
	case codeNoSuchJob:
		return ErrNoSuchJob
	case codeAmbiguousJob:
		return ErrAmbiguousJob
	}
	return nil
}

// remoteError is an error reported by the gateway over the admin socket.
type remoteError struct {
	msg      string
	sentinel error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.sentinel }

// CreateToken makes a token through the gateway of stateDir if it runs,
// else directly in its state database (creating stateDir, mode 0700, if
// needed). It returns the clear token, which cannot be recovered later.
func CreateToken(ctx context.Context, stateDir, name string, ttl time.Duration) (string, store.Token, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.CreateToken(ctx, name, ttl)
	}
	if !errors.Is(err, ErrNoGateway) {
		return "", store.Token{}, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return "", store.Token{}, fmt.Errorf("create token: state dir: %w", err)
	}
	var secret string
	var tok store.Token
	err = withLocalTokens(stateDir, func(st *store.Store) error {
		var err error
		secret, tok, err = st.CreateToken(name, ttl, time.Now())
		return err
	})
	return secret, tok, err
}

// ListTokens lists the tokens of stateDir through its gateway if it runs,
// else from its state database. A state directory without a database has
// no tokens.
func ListTokens(ctx context.Context, stateDir string) ([]store.Token, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.Tokens(ctx)
	}
	if !errors.Is(err, ErrNoGateway) {
		return nil, err
	}
	if ok, err := statefile.Exists(filepath.Join(stateDir, store.FileName)); err != nil || !ok {
		return nil, err
	}
	var toks []store.Token
	err = withStore(stateDir, func(st *store.Store) error {
		var err error
		toks, err = st.Tokens()
		return err
	})
	return toks, err
}

// RevokeToken deletes the named token of stateDir through its gateway if it
// runs, which also ends the token's live leases, else in its state
// database. The error wraps store.ErrNotFound if there is no such token.
func RevokeToken(ctx context.Context, stateDir, name string) (RevokeResult, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.RevokeToken(ctx, name)
	}
	if !errors.Is(err, ErrNoGateway) {
		return RevokeResult{}, err
	}
	if ok, err := statefile.Exists(filepath.Join(stateDir, store.FileName)); err != nil {
		return RevokeResult{}, err
	} else if !ok {
		return RevokeResult{}, fmt.Errorf("revoke token %q: %w (no state db in %s)", name, store.ErrNotFound, stateDir)
	}
	return RevokeResult{}, withLocalTokens(stateDir, func(st *store.Store) error { return st.RevokeToken(name) })
}

// withLocalTokens is withStore for commands that change tokens: it
// refuses the state directory of a fleet member, whose tokens live in the
// fleet's database (its file holds only a copy, replaced at its next
// start).
func withLocalTokens(stateDir string, fn func(*store.Store) error) error {
	return withStore(stateDir, func(st *store.Store) error {
		if db, err := st.Fleet(); err != nil {
			return err
		} else if db != "" {
			return fmt.Errorf("the gateway of %s is a member of a fleet and is not running: its tokens live in the fleet's database; run the command with --store %s (or start the gateway)", stateDir, db)
		}
		return fn(st)
	})
}

// withStore runs fn on the state database of stateDir, opened for the
// duration of the call.
func withStore(stateDir string, fn func(*store.Store) error) error {
	st, err := store.Open(filepath.Join(stateDir, store.FileName), storeLockTimeout)
	if err != nil {
		if errors.Is(err, store.ErrLocked) {
			return fmt.Errorf("%w (its admin socket %s does not answer: restart the gateway)", err, filepath.Join(stateDir, SocketName))
		}
		return err
	}
	ferr := fn(st)
	if err := st.Close(); err != nil && ferr == nil {
		ferr = err
	}
	return ferr
}
