// SPDX-License-Identifier: MIT

package control_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

// TestJoinVersion: the server refuses a client older than
// version.MinClient with a final error naming the fix, and serves a client
// of this version, an unversioned (v0.2) client and a development build.
func TestJoinVersion(t *testing.T) {
	gw := controltest.Start(t, nil, controltest.Options{})
	c := newClient(t, gw)
	ctx := context.Background()
	tok := gw.Token(t)
	for _, tt := range []struct {
		version string
		ok      bool
	}{
		{"", true}, {"v0.2.0", true}, {"v0.3.0", true}, {"v9.0.0", true}, {"dev", true},
		{"v0.1.5", false}, {"v0.1.0-rc1", false},
	} {
		req := joinReq(tok)
		req.Version = tt.version
		lease, err := c.Join(ctx, req)
		if tt.ok {
			if err != nil {
				t.Errorf("client %q: %v, want a lease", tt.version, err)
				continue
			}
			if err := c.Release(ctx, control.LeaseRef{ID: lease.ID, Secret: lease.Secret}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var api *control.APIError
		if !errors.Is(err, control.ErrVersionUnsupported) || !errors.As(err, &api) || api.Status != 426 ||
			!strings.Contains(api.Message, "airlock "+tt.version+" on this node is older than this gateway") || !strings.Contains(api.Message, "upgrade airlock on the node") {
			t.Errorf("client %q: %v, want 426 version_unsupported naming the version and the fix", tt.version, err)
		}
	}
	// Refusals for the version are not failures of the client's
	// credentials: they do not rate-limit its address.
	req := joinReq(tok)
	req.Version = "v0.1.0"
	for range 30 {
		c.Join(ctx, req)
	}
	if _, err := c.Join(ctx, joinReq(tok)); err != nil {
		t.Errorf("a current client after 30 version refusals from its address: %v", err)
	}
}
