// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/test/pgtest"
	"github.com/airlock-vpn/airlock/test/topology"
)

// pollFailing calls try until it reports done or timeout passes. Each
// refused join counts against this address's failure bucket
// (control.DefaultFailureBurst 5, refilled at DefaultFailureLimit, one a
// 2 s): tries come every 250 ms until four have failed, then one a
// failure's refill apart, so waiting on a gateway that has not yet
// learned a token never turns into rate_limited however long the
// database's notification takes on a loaded machine.
func pollFailing(timeout time.Duration, try func() (done, failed bool)) bool {
	deadline := time.Now().Add(timeout)
	fails := 0
	for {
		done, failed := try()
		if done {
			return true
		}
		if failed {
			fails++
		}
		every := 250 * time.Millisecond
		if fails >= control.DefaultFailureBurst-1 {
			every = time.Duration(float64(time.Second)/float64(control.DefaultFailureLimit)) + 100*time.Millisecond
		}
		if time.Now().Add(every).After(deadline) {
			return false
		}
		<-time.After(every)
	}
}

// TestFleetGateways runs two in-process gateways on one real PostgreSQL
// database: a token made through A's admin socket admits a job on B, whose
// lease lists both gateways; a revocation on A ends B's lease at once (its
// watch says so); a kick with a ban on A of B's job ends it there and the
// ban refuses the job's host on both; whois through A's admin socket names
// B's job. (test/e2e TestFleet does the same with the binary, three hosts,
// outages and failover.)
func TestFleetGateways(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	url := c.URL(pgtest.Superuser, db)
	key := testFleetKey(t)
	if _, _, err := pgstore.Migrate(context.Background(), pgstore.Config{URL: url}); err != nil {
		t.Fatal(err)
	}
	fleetCfg := func(subnet string) func(*Config) {
		return func(cfg *Config) {
			cfg.Store = StoreConfig{URL: url, FleetKey: key}
			cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(subnet)}
			cfg.RenewInterval, cfg.LeaseTTL = 10*time.Second, 30*time.Second
		}
	}
	reg := prometheus.NewRegistry()
	a := startGatewayWith(t, func(cfg *Config) {
		fleetCfg("100.64.0.0/16")(cfg)
		cfg.Registry = reg
	})
	b := startGatewayWith(t, fleetCfg("100.65.0.0/16"))
	ctx := context.Background()
	tok, _, err := admin.CreateToken(ctx, a.state, "fleet", 0)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := control.NewClient(b.info.Control.String(), b.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	job := control.JobInfo{BatchJobID: "fleet-1", Hostname: "node1"}
	var l control.Lease
	// B learns the token from the database's notification; the members
	// list fills at the heartbeats (2 s).
	if !pollFailing(10*time.Second, func() (bool, bool) {
		l, err = cc.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: job})
		if err == nil && len(l.Members) != 2 {
			cc.Release(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
		}
		return err == nil && len(l.Members) == 2, err != nil
	}) {
		t.Fatalf("join on B with a token made on A: %v, members %+v; want a lease listing both gateways", err, l.Members)
	}
	if v := gaugeValue(t, reg, "airlock_fleet_database_up"); v != 1 {
		t.Errorf("airlock_fleet_database_up = %v, want 1", v)
	}
	if !topology.Poll(3*time.Second, func() bool { return gaugeValue(t, reg, "airlock_fleet_members") == 2 }) {
		t.Errorf("airlock_fleet_members = %v after a heartbeat, want 2", gaugeValue(t, reg, "airlock_fleet_members"))
	}
	pins := map[string]bool{}
	for _, m := range l.Members {
		pins[m.Pin] = true
	}
	if !pins[a.info.Fingerprint] || !pins[b.info.Fingerprint] {
		t.Errorf("members %+v, want A's and B's pins", l.Members)
	}

	watchEnd := func(l control.Lease) <-chan error {
		w, err := cc.Watch(ctx, control.LeaseRef{ID: l.ID, Secret: l.Secret})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		ended := make(chan error, 1)
		go func() {
			for {
				if _, err := w.Next(); err != nil {
					ended <- err
					return
				}
			}
		}()
		return ended
	}

	// Whois through A names B's job (after the shipper's round).
	var recs []store.LeaseRecord
	if !topology.Poll(5*time.Second, func() bool {
		ac, derr := admin.Dial(a.state)
		if derr != nil {
			t.Fatal(derr)
		}
		recs, err = ac.Whois(ctx, netip.AddrPortFrom(l.PublicAddrs[0], l.Ports[0]), time.Now())
		ac.Close()
		return err == nil && len(recs) == 1 && recs[0].JobID == "fleet-1" && recs[0].Gateway != ""
	}) {
		t.Fatalf("whois on A of B's job at %v:%d: %+v %v", l.PublicAddrs[0], l.Ports[0], recs, err)
	}

	// Kick with a ban, asked on A; B ends it.
	ended := watchEnd(l)
	ac := adminClient(t, a)
	res, err := ac.Kick(ctx, admin.KickRequest{Job: "fleet-1", Reason: "abuse", Ban: "1h"})
	if err != nil || len(res.Kicked) != 1 || res.Kicked[0].Gateway == "" {
		t.Fatalf("kick on A of B's job: %+v %v", res, err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, control.ErrLeaseEnded) || !strings.Contains(err.Error(), "abuse") {
			t.Errorf("watch ended with %v, want ErrLeaseEnded with the reason", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("kicked job's watch not ended within 2 s")
	}
	ca, err := control.NewClient(a.info.Control.String(), a.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	// Each client in turn, until both refuse.
	clients := []*control.Client{cc, ca}
	if !topology.Poll(time.Second, func() bool {
		for len(clients) > 0 {
			_, err = clients[0].Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: job})
			if !errors.Is(err, control.ErrBanned) {
				return false
			}
			clients = clients[1:]
		}
		return true
	}) {
		t.Fatalf("join of the banned host: %v, want ErrBanned on both gateways within 1 s", err)
	}

	// Revocation on A ends a job on B at once. (Another token: the ban
	// holds for the address the test's joins come from.)
	tok2, _, err := admin.CreateToken(ctx, a.state, "fleet2", 0)
	if err != nil {
		t.Fatal(err)
	}
	var l2 control.Lease
	// B learns the new token from the database's notification.
	if !pollFailing(10*time.Second, func() (bool, bool) {
		l2, err = cc.Join(ctx, control.JoinRequest{Token: tok2, PublicKey: freshKey(t), Job: control.JobInfo{BatchJobID: "fleet-2", Hostname: "node2"}})
		return err == nil, err != nil
	}) {
		t.Fatalf("join on B with a token made on A 1 s before: %v", err)
	}
	// Watch returns once the gateway has answered the watch: it is open.
	ended = watchEnd(l2)
	t0 := time.Now()
	if _, err := ac.RevokeToken(ctx, "fleet2"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, control.ErrLeaseEnded) {
			t.Errorf("watch ended with %v, want ErrLeaseEnded", err)
		}
		t.Logf("revocation on A ended the job on B after %v", time.Since(t0).Round(time.Millisecond))
		if time.Since(t0) > time.Second {
			t.Errorf("revocation on A ended B's job after %v, want within 1 s", time.Since(t0))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("revocation on A did not end B's job within 3 s")
	}

	// With A stopped, a token made in its state directory would be a
	// local copy that A's next start replaces: refused, naming --store.
	a.stop()
	if _, _, err := admin.CreateToken(ctx, a.state, "lost", 0); err == nil || !strings.Contains(err.Error(), "--store") {
		t.Errorf("token create in a stopped fleet member's state directory: %v, want a refusal naming --store", err)
	}
}

// TestFleetKeyRotation: a gateway's identity in the fleet is its member
// id, which a TLS key rotation and a restart keep. During the rotation the
// fleet announces both of its pins (a client that learns them then still
// trusts it after --finish), after --finish the new one; after a restart
// the fleet still has two members (no ghost of the old pin), and a kick
// asked on A of a job that B held before the restart reaches B.
func TestFleetKeyRotation(t *testing.T) {
	pgtest.Require(t)
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	url := c.URL(pgtest.Superuser, db)
	key := testFleetKey(t)
	ctx := context.Background()
	if _, _, err := pgstore.Migrate(ctx, pgstore.Config{URL: url}); err != nil {
		t.Fatal(err)
	}
	fleetCfg := func(subnet, state, listen string) func(*Config) {
		return func(cfg *Config) {
			cfg.Store = StoreConfig{URL: url, FleetKey: key}
			cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(subnet)}
			cfg.RenewInterval, cfg.LeaseTTL = 10*time.Second, 60*time.Second
			if state != "" {
				cfg.StateDir, cfg.Listen = state, listen
			}
		}
	}
	a := startGatewayWith(t, fleetCfg("100.64.0.0/16", "", ""))
	b := startGatewayWith(t, fleetCfg("100.65.0.0/16", "", ""))
	pdb, err := pgstore.Open(ctx, pgstore.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	// memberB waits until B's member record satisfies ok.
	memberB := func(what string, ok func(store.Member) bool) store.Member {
		t.Helper()
		var ms []store.Member
		var last store.Member
		var err error
		if !topology.Poll(10*time.Second, func() bool {
			ms, err = pdb.Members()
			for _, m := range ms {
				if m.Advertise == b.info.Advertise && !m.Stopped {
					last = m
					if ok(m) {
						return true
					}
				}
			}
			return false
		}) {
			t.Fatalf("B's member record %s: %+v %v (all: %+v)", what, last, err, ms)
		}
		return last
	}
	oldPin := b.info.Fingerprint
	before := memberB("with its pin", func(m store.Member) bool { return m.Pin == oldPin })
	if before.ID == oldPin || !strings.HasPrefix(before.ID, "gw-") {
		t.Fatalf("B's member id %q: want a member id, not its pin", before.ID)
	}

	tok, _, err := admin.CreateToken(ctx, a.state, "rot", 0)
	if err != nil {
		t.Fatal(err)
	}
	cb, err := control.NewClient(b.info.Control.String(), oldPin, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	var l control.Lease
	// B learns the token from the database's notification.
	if !pollFailing(10*time.Second, func() (bool, bool) {
		l, err = cb.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: control.JobInfo{BatchJobID: "rot-1", Hostname: "node1"}})
		return err == nil, err != nil
	}) {
		t.Fatalf("join on B with a token made on A: %v", err)
	}

	bc := adminClient(t, b)
	rot, err := bc.RotateKey(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	both := memberB("during the rotation", func(m store.Member) bool { return m.Pin == rot.Next+"|"+oldPin })
	// A client that learns B from A's lease now still trusts B after
	// --finish.
	ca, err := control.NewClient(a.info.Control.String(), a.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	var learned string
	if !topology.PollEvery(5*time.Second, 200*time.Millisecond, func() bool {
		la, err := ca.Join(ctx, control.JoinRequest{Token: tok, PublicKey: freshKey(t), Job: control.JobInfo{BatchJobID: "rot-a", Hostname: "node2"}})
		if err != nil {
			t.Fatal(err)
		}
		ca.Release(ctx, control.LeaseRef{ID: la.ID, Secret: la.Secret})
		for _, m := range la.Members {
			if m.Gateway == b.info.Advertise {
				learned = m.Pin
			}
		}
		return learned == both.Pin
	}) {
		t.Fatalf("A's lease names B with pin %q, want %q", learned, both.Pin)
	}
	if _, err := bc.RotateKey(ctx, true); err != nil {
		t.Fatal(err)
	}
	after := memberB("after --finish", func(m store.Member) bool { return m.Pin == rot.Next })
	if after.ID != before.ID {
		t.Errorf("member id after --finish: %q, want %q", after.ID, before.ID)
	}
	learnedClient, err := control.NewClient(b.info.Advertise, learned, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := learnedClient.Health(ctx); err != nil {
		t.Errorf("client with the pins learned during the rotation, after --finish: %v", err)
	}
	learnedClient.Close()

	// Restart B on the same state directory and address.
	b.stop()
	b2 := startGatewayWith(t, fleetCfg("100.65.0.0/16", b.state, b.info.Control.String()))
	if b2.info.Fingerprint != rot.Next {
		t.Fatalf("B's pin after restart: %s, want the rotated %s", b2.info.Fingerprint, rot.Next)
	}
	restarted := memberB("after the restart", func(m store.Member) bool { return m.Started.After(before.Started) })
	if restarted.ID != before.ID || restarted.Pin != rot.Next {
		t.Errorf("B after the restart: member %q pin %q, want member %q pin %q", restarted.ID, restarted.Pin, before.ID, rot.Next)
	}
	st, err := fleet.FleetStatus(pdb)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Members) != 2 {
		t.Errorf("fleet after B's key rotation and restart: %d members, want 2 (no ghost): %+v", len(st.Members), st.Members)
	}
	var held []string
	for _, m := range st.Members {
		if m.ID == before.ID {
			for _, r := range m.Leases {
				held = append(held, r.JobID)
			}
		}
	}
	if !slices.Contains(held, "rot-1") {
		t.Errorf("B's live leases in the fleet status after the restart: %v, want rot-1", held)
	}
	// The job B held before the restart is kicked through A: the kick is
	// addressed to B's member id, which B still answers to.
	res, err := adminClient(t, a).Kick(ctx, admin.KickRequest{Job: "rot-1", Reason: "after rotation"})
	if err != nil || len(res.Kicked) != 1 || res.Kicked[0].Lease != l.ID {
		t.Fatalf("kick on A of B's job after B's key rotation and restart: %+v %v", res, err)
	}
}

// TestFleetCapture: airlock capture on A of a job that B holds is relayed
// from B through the fleet, with the selection and filter of a local
// capture, and ends with the job's lease. B's relay endpoint serves only a
// ticket made for it in the database, once, with its secret, before it
// expires, for a lease it holds; a source that keeps presenting bad
// tickets is rate-limited like one that guesses tokens.
func TestFleetCapture(t *testing.T) {
	pgtest.Require(t)
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
			go func() { defer c.Close(); c.Write([]byte("HTTP/1.0 200 OK\r\n\r\n")) }()
		}
	}()
	c := pgtest.Start(t)
	db := c.CreateDB(t)
	url := c.URL(pgtest.Superuser, db)
	key := testFleetKey(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, _, err := pgstore.Migrate(ctx, pgstore.Config{URL: url}); err != nil {
		t.Fatal(err)
	}
	fleetCfg := func(subnet string) func(*Config) {
		return func(cfg *Config) {
			cfg.Store = StoreConfig{URL: url, FleetKey: key}
			cfg.Subnets = []netip.Prefix{netip.MustParsePrefix(subnet)}
			cfg.RenewInterval, cfg.LeaseTTL = 10*time.Second, 60*time.Second
		}
	}
	a := startGatewayWith(t, fleetCfg("100.64.0.0/16"))
	b := startGatewayWith(t, fleetCfg("100.65.0.0/16"), remote{job: "198.51.100.7:80", real: ln.Addr().String()})
	pdb, err := pgstore.Open(ctx, pgstore.Config{URL: url})
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	j := joinJob(t, b, newToken(t, b)) // batch job id t1
	var bID string
	// B's shipper writes the lease, its heartbeat its member record.
	if !topology.Poll(5*time.Second, func() bool {
		r, err := fleet.FindLease(pdb, "t1")
		if err == nil {
			bID, err = pdb.LeaseMember(r.ID)
		}
		return err == nil
	}) {
		t.Fatal("B's lease not in the database within 5 s")
	}

	ac := adminClient(t, a)
	if _, err := ac.Capture(ctx, admin.CaptureRequest{Job: "t1", Filter: "port http"}); err == nil {
		t.Error("relayed capture with a bad filter: got nil error")
	}
	live, err := ac.Capture(ctx, admin.CaptureRequest{Job: "t1", Filter: "tcp port 80"})
	if err != nil {
		t.Fatalf("capture on A of B's job: %v", err)
	}
	defer live.Close()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(live); got <- b }()
	req := "GET /fleet-capture HTTP/1.0\r\nHost: example.org\r\n\r\n"
	conn, err := j.net.DialContext(ctx, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	conn.Write([]byte(req))
	io.Copy(io.Discard, conn)
	conn.Close()
	if u, err := j.net.DialContext(ctx, "udp", "198.51.100.7:9"); err == nil { // not "tcp port 80"
		u.Write([]byte("udp-not-captured"))
		u.Close()
	}
	time.Sleep(300 * time.Millisecond)

	// B's relay endpoint, as a network peer (or a thief of one
	// ticket) sees it.
	cb, err := control.NewClient(b.info.Control.String(), b.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	ca, err := control.NewClient(a.info.Control.String(), a.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer ca.Close()
	ticket := func(lease, gw string, ttl time.Duration) control.CaptureTicket {
		secret := fmt.Sprintf("secret-%d", time.Now().UnixNano())
		h := sha256.Sum256([]byte(secret))
		id, err := pdb.RequestCapture(pgstore.Capture{Lease: lease, Gateway: gw, Job: "t1", By: "test"}, h[:], ttl)
		if err != nil {
			t.Fatal(err)
		}
		return control.CaptureTicket{ID: id, Secret: secret}
	}
	status := func(err error) int {
		var ae *control.APIError
		if errors.As(err, &ae) {
			return ae.Status
		}
		return 0
	}
	j1 := j.lease.ID
	good := ticket(j1, bID, time.Minute)
	if _, err := ca.FleetCapture(ctx, good); status(err) != http.StatusForbidden {
		t.Errorf("B's ticket presented to A: got %v, want 403", err)
	}
	s, err := cb.FleetCapture(ctx, good)
	if err != nil {
		t.Fatalf("B's ticket presented to B: %v", err)
	}
	s.Close()
	for _, bad := range []struct {
		what string
		t    control.CaptureTicket
		want int
	}{
		{"a used ticket", good, http.StatusForbidden},
		{"a wrong secret", control.CaptureTicket{ID: ticket(j1, bID, time.Minute).ID, Secret: "guess"}, http.StatusForbidden},
		{"a ticket for a lease B does not hold", ticket("no-such-lease", bID, time.Minute), http.StatusNotFound},
	} {
		if _, err := cb.FleetCapture(ctx, bad.t); status(err) != bad.want {
			t.Errorf("%s: got %v, want %d", bad.what, err, bad.want)
		}
	}
	expired := ticket(j1, bID, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	if _, err := cb.FleetCapture(ctx, expired); status(err) != http.StatusForbidden {
		t.Errorf("an expired ticket: got %v, want 403", err)
	}

	// The job's lease ends (a kick through A): both captures end.
	if _, err := ac.Kick(ctx, admin.KickRequest{Job: "t1", Reason: "capture test"}); err != nil {
		t.Fatal(err)
	}
	var stream []byte
	select {
	case stream = <-got:
	case <-ctx.Done():
		t.Fatal("the relayed capture did not end with the job's lease")
	}
	n, found, udp := 0, false, false
	for _, p := range pcapPackets(t, stream) {
		n++
		if len(p) >= 20 && netip.AddrFrom4([4]byte(p[12:16])) == j.lease.Addresses[0].Addr() && bytes.Contains(p, []byte(req)) {
			found = true
		}
		udp = udp || bytes.Contains(p, []byte("udp-not-captured"))
	}
	if !found || udp {
		t.Errorf("relayed capture: %d packets, request from the job found %v (want true), UDP %v (want false)", n, found, udp)
	}
	t.Logf("relayed capture: %d packets", n)

	// Guessing goes on: the source is refused before the database is
	// asked again.
	limited := false
	for range 10 {
		if _, err := cb.FleetCapture(ctx, control.CaptureTicket{ID: 1, Secret: "guess"}); status(err) == http.StatusTooManyRequests {
			limited = true
			break
		}
	}
	if !limited {
		t.Error("10 more bad tickets from one source: never rate-limited (429)")
	}
}
