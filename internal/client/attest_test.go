// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/tuntest"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/internal/syncbuf"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestSessionAttests checks what a session sends a gateway that checks
// MUNGE credentials: a join credential made by this node's munged for
// that gateway and the join's key, with root's job credential bound to
// it on the first join only; a rejoin carries a fresh join credential and
// no job credential (it is spent). A gateway that checks none gets none.
func TestSessionAttests(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	mc := munge.Client{Socket: d.Socket}
	ctx := context.Background()
	jc, err := attest.MakeJob(ctx, mc, attest.JobPayload{Batch: "slurm", JobID: "7", UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}, 300)
	if err != nil {
		t.Fatal(err)
	}
	start := func(t *testing.T, checks string) (*Session, *controltest.Backend, *controltest.Gateway) {
		b := &controltest.Backend{Attest: checks}
		g := controltest.Start(t, b, controltest.Options{WatchHeartbeat: time.Second})
		gws, err := ParseGateways(g.Addr, g.Pin, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		att, err := newNodeAttest(AttestAuto, d.Socket, jc)
		if err != nil {
			t.Fatal(err)
		}
		priv, err := wgkey.Generate()
		if err != nil {
			t.Fatal(err)
		}
		s := NewSession(SessionConfig{attest: att, Logger: slog.New(slog.DiscardHandler), Stderr: &syncbuf.Buffer{}, Gateways: gws, Key: priv,
			Join:      control.JoinRequest{Token: g.Token(t)},
			Transport: TransportUDP, TransportTimeout: time.Second, FailoverAfter: time.Second, JoinTimeout: 5 * time.Second})
		s.warnAfter = 10 * time.Millisecond
		if err := s.Join(ctx); err != nil {
			t.Fatal(err)
		}
		return s, b, g
	}

	t.Run("Checks", func(t *testing.T) {
		s, b, g := start(t, "munge")
		s.lease.RenewInterval = control.Duration(50 * time.Millisecond)
		if err := s.StartTunnel(ctx, tuntest.NewChannelTUN().TUN()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.wg.Close(); s.closeClients() })
		first := b.Joins()[0]
		if first.Attest == nil || first.Attest.MungeJob != jc {
			t.Fatalf("first join %+v, want a join credential and the job credential", first.Attest)
		}
		cred, err := mc.Decode(ctx, first.Attest.Munge)
		if err != nil {
			t.Fatal(err)
		}
		p, err := attest.ParseJoinPayload(cred.Payload)
		if err != nil || p.Gateway != g.Pin || p.Key != s.priv.PublicKey() || p.JobCred != attest.JobCredHash(jc) || cred.UID != uint32(os.Getuid()) {
			t.Errorf("join credential payload %+v (%v), uid %d; want this gateway, this key, the job credential's hash", p, err, cred.UID)
		}
		// The gateway forgets the lease: the session joins again.
		b.SetRenewErr(fmt.Errorf("%w: no such lease", control.ErrUnknownLease))
		sctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); s.Supervise(sctx) }()
		topology.Poll(5*time.Second, func() bool { return len(b.Joins()) >= 2 })
		b.SetRenewErr(nil)
		cancel()
		<-done
		js := b.Joins()
		if len(js) < 2 {
			t.Fatalf("no rejoin: %d joins", len(js))
		}
		if js[1].Attest == nil || js[1].Attest.MungeJob != "" || js[1].Attest.Munge == first.Attest.Munge {
			t.Errorf("rejoin %+v, want a new join credential and no job credential", js[1].Attest)
		}
	})

	t.Run("DoesNotCheck", func(t *testing.T) {
		s, b, _ := start(t, "")
		defer s.closeClients()
		if a := b.Joins()[0].Attest; a != nil {
			t.Errorf("join to a gateway that checks no credential carried %+v", a)
		}
	})
}

// TestNamedSocketMissing (issue 33, item 1): a munged socket the site
// named (--munge-socket, AIRLOCK_MUNGE_SOCKET, the SPANK plugin's
// munge_socket=) that is missing is an error that says so, in auto mode
// too: never a join with MUNGE's default munged, nor silently without a
// credential.
func TestNamedSocketMissing(t *testing.T) {
	sock := t.TempDir() + "/munge.socket"
	for _, mode := range []string{"", AttestAuto, AttestMunge} {
		if _, err := newNodeAttest(mode, sock, ""); err == nil || !strings.Contains(err.Error(), sock) {
			t.Errorf("mode %q, named socket missing: %v, want an error naming it", mode, err)
		}
	}
	if a, err := newNodeAttest(AttestOff, sock, "MUNGE:x:"); err != nil || a.possible() {
		t.Errorf("--attest off with a named socket missing: %+v %v, want no credentials and no error", a, err)
	}
}
