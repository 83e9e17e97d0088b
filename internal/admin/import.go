// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/airlock-vpn/airlock/internal/store"
)

// ImportToken asks the gateway to store an existing token; see
// store.Store.ImportToken.
func (c *Client) ImportToken(ctx context.Context, name, secret string, ttl time.Duration) (store.Token, error) {
	req := createTokenRequest{Name: name, Secret: secret}
	if ttl != 0 {
		req.TTL = ttl.String()
	}
	var resp createTokenResponse
	if err := c.do(ctx, http.MethodPost, "/v1/tokens", req, &resp); err != nil {
		return store.Token{}, fmt.Errorf("import token: %w", err)
	}
	return resp.Token, nil
}

// ImportToken stores an existing token (made on another gateway) in
// stateDir through its gateway if it runs, else directly in its state
// database, so that one token works with several gateways.
func ImportToken(ctx context.Context, stateDir, name, secret string, ttl time.Duration) (store.Token, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.ImportToken(ctx, name, secret, ttl)
	}
	if !errors.Is(err, ErrNoGateway) {
		return store.Token{}, err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return store.Token{}, fmt.Errorf("import token: state dir: %w", err)
	}
	var tok store.Token
	err = withLocalTokens(stateDir, func(st *store.Store) error {
		var err error
		tok, err = st.ImportToken(name, secret, ttl, time.Now())
		return err
	})
	return tok, err
}
