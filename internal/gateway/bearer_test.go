// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/bearer/bearertest"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestBearerGateway runs a gateway whose config trusts an in-process
// issuer: a job joins with a bearer token alone and is counted as
// issuer-verified; a renewal carrying a token of another subject is
// refused (a job keeps its identity), one of the same subject extends the
// identity; a lease whose token expired ends at its next renewal saying
// so; reloaded without [[issuer]], the gateway refuses bearer tokens.
func TestBearerGateway(t *testing.T) {
	dir := t.TempDir()
	key := bearertest.NewEC("k1")
	iss, err := bearertest.Serve(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	defer iss.Close()
	conf := filepath.Join(dir, "gateway.toml")
	doc := fmt.Sprintf("version = 1\n[bearer]\nleeway = \"1s\"\n[[issuer]]\nname = \"exp\"\nurl = %q\naudience = [\"gw-test\"]\nscopes = [\"compute.create\"]\nca_file = %q\n", iss.URL, iss.CAFile)
	if err := os.WriteFile(conf, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reload := make(chan struct{})
	g := startGatewayWith(t, func(c *Config) { c.ConfigFile, c.Registry, c.Reload = conf, reg, reload })
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx := context.Background()
	tok := func(sub string, ttl time.Duration) string {
		return key.Sign(bearertest.Claims(iss.URL, sub, "gw-test", ttl, "compute.create"))
	}
	if h, err := cc.Health(ctx); err != nil || !h.Bearer {
		t.Fatalf("health %+v %v, want bearer", h, err)
	}
	ls, err := cc.Join(ctx, control.JoinRequest{PublicKey: freshKey(t), Bearer: tok("alice", time.Hour)})
	if err != nil {
		t.Fatalf("join with a bearer token alone: %v", err)
	}
	if n := gauge(t, reg, "airlock_jobs_issuer_verified", "issuer", "exp"); n != 1 {
		t.Errorf("airlock_jobs_issuer_verified{issuer=exp} = %v, want 1", n)
	}
	ref := control.LeaseRef{ID: ls.ID, Secret: ls.Secret}
	_, err = cc.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bearer: tok("bob", time.Hour)})
	if !errors.Is(err, control.ErrBearer) || !strings.Contains(err.Error(), "keeps its identity") {
		t.Errorf("renewal with another subject's token: %v, want ErrBearer", err)
	}
	if _, err := cc.RenewReport(ctx, control.RenewRequest{LeaseRef: ref, Bearer: tok("alice", time.Hour)}); err != nil {
		t.Errorf("renewal with the subject's new token: %v", err)
	}

	short, err := cc.Join(ctx, control.JoinRequest{PublicKey: freshKey(t), Bearer: tok("carol", 2*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(3500 * time.Millisecond) // exp + leeway
	_, err = cc.RenewReport(ctx, control.RenewRequest{LeaseRef: control.LeaseRef{ID: short.ID, Secret: short.Secret}, Bearer: tok("carol", -time.Minute)})
	if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "bearer token expired") {
		t.Errorf("renewal after the token expired (an expired one presented): %v, want the lease ended saying why", err)
	}
	if _, err := cc.RenewReport(ctx, control.RenewRequest{LeaseRef: ref}); err != nil {
		t.Errorf("the other lease: %v", err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{PublicKey: freshKey(t), Bearer: tok("dave", -time.Minute)}); !errors.Is(err, control.ErrBearer) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("join with an expired token: %v, want ErrBearer", err)
	}

	// A reload without [[issuer]]: tokens are refused, not ignored.
	if err := os.WriteFile(conf, []byte("version = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	reload <- struct{}{}
	var h control.Health
	if !topology.Poll(10*time.Second, func() bool {
		h, err = cc.Health(ctx)
		return err == nil && !h.Bearer
	}) {
		t.Fatalf("health after the reload: %+v %v, want no bearer", h, err)
	}
	if _, err := cc.Join(ctx, control.JoinRequest{PublicKey: freshKey(t), Bearer: tok("alice", time.Hour)}); !errors.Is(err, control.ErrBearer) || !strings.Contains(err.Error(), "no bearer tokens") {
		t.Errorf("bearer token at a gateway without issuers: %v, want ErrBearer", err)
	}
}

// gauge reads the value of metric name whose label has value.
func gauge(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, p := range m.GetLabel() {
				if p.GetName() == label && p.GetValue() == value {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}
