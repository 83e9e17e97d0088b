// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-vpn/airlock/internal/httpjson"
	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/store"
)

// handleWhois answers GET /v1/whois?addr=IP&port=N&at=RFC3339 from the lease
// history.
func (s *Server) handleWhois(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	addr, err := netip.ParseAddr(q.Get("addr"))
	if err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("bad addr %q: want an IP address", q.Get("addr"))})
		return
	}
	port, err := strconv.ParseUint(q.Get("port"), 10, 16)
	if err != nil {
		httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("bad port %q: want 0-65535", q.Get("port"))})
		return
	}
	at := time.Now()
	if v := q.Get("at"); v != "" {
		if at, err = time.Parse(time.RFC3339Nano, v); err != nil {
			httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: fmt.Sprintf("bad at %q: want RFC 3339, e.g. 2026-11-22T10:00:00Z", v)})
			return
		}
	}
	recs, err := s.store.Whois(addr, uint16(port), at)
	if err != nil {
		s.writeStoreError(w, err)
		return
	}
	if recs == nil {
		recs = []store.LeaseRecord{}
	}
	httpjson.Write(w, http.StatusOK, recs)
}

// Whois asks the running gateway which leases held addr:port at time at.
func (c *Client) Whois(ctx context.Context, addr netip.AddrPort, at time.Time) ([]store.LeaseRecord, error) {
	v := url.Values{}
	v.Set("addr", addr.Addr().String())
	v.Set("port", strconv.Itoa(int(addr.Port())))
	v.Set("at", at.Format(time.RFC3339Nano))
	var recs []store.LeaseRecord
	if err := c.do(ctx, http.MethodGet, "/v1/whois?"+v.Encode(), nil, &recs); err != nil {
		return nil, fmt.Errorf("whois %s: %w", addr, err)
	}
	return recs, nil
}

// Whois answers from the gateway's lease history which job held addr:port
// at time at: through the admin socket if the gateway runs, else from the
// state database directly, so it works after the gateway stopped.
func Whois(ctx context.Context, stateDir string, addr netip.AddrPort, at time.Time) ([]store.LeaseRecord, error) {
	c, err := Dial(stateDir)
	if err == nil {
		defer c.Close()
		return c.Whois(ctx, addr, at)
	}
	if !errors.Is(err, ErrNoGateway) {
		return nil, err
	}
	if ok, err := statefile.Exists(filepath.Join(stateDir, store.FileName)); err != nil {
		return nil, err
	} else if !ok {
		return nil, fmt.Errorf("no state database in %s: is this the gateway's --state directory?", stateDir)
	}
	var recs []store.LeaseRecord
	err = withStore(stateDir, func(st *store.Store) error {
		var err error
		recs, err = st.Whois(addr.Addr(), addr.Port(), at)
		return err
	})
	return recs, err
}
