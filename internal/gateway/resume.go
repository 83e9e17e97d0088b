// SPDX-License-Identifier: MIT

package gateway

import (
	"crypto/sha256"
	"fmt"
	"net/netip"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/identity"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Lease persistence: a join records, with the lease's history entry, what a
// restart needs to take the lease back (store.ResumeState: the secret's
// hash, the job's WireGuard key, the block index and count, and the expose
// request).
// Stopping the gateway leaves live leases open in the history; the next
// start restores each one with a fresh TTL (the client could not renew
// while the gateway was down), re-admits its WireGuard peer, port block,
// limits and exposed ports, and closes the records it cannot restore (a
// changed subnet or port plan). The client's lease id, secret, tunnel
// address and port block stay valid: it only needs a new handshake, which
// the gateway starts itself, paced, where it kept the job's endpoint
// (rehandshake.go), and the job otherwise when its control session shows a
// new gateway instance.

// resumeState is what the history keeps of live lease l to restore it.
func resumeState(l lease.Lease, pub wgkey.Key, expose []control.Port) *store.ResumeState {
	h := l.SecretHash()
	r := &store.ResumeState{SecretHash: h[:], PublicKey: pub.String(), Block: l.Block}
	if l.Blocks > 1 {
		r.Blocks = l.Blocks
	}
	for _, p := range expose {
		r.Expose = append(r.Expose, p.String())
	}
	return r
}

// restoreLeases takes back the live leases of the previous run. It
// returns how many it restored and how many it had to close.
func (g *gateway) restoreLeases(now time.Time) (restored, closed int, err error) {
	recs, err := g.st.ActiveLeases()
	if err != nil {
		return 0, 0, err
	}
	g.loadEndpoints()
	live, err := g.admit.liveTokens(now)
	if err != nil {
		return 0, 0, err
	}
	for _, r := range recs {
		byBearer := r.Issued != nil && r.Issued.As != "" // its token is the issuer's name
		// A job that joined by its MUNGE credential alone has no token
		// to outlive: it is restored while the gateway still takes
		// attested joins without one.
		tokenless := r.Token == "" && r.Attested != nil && !byBearer
		if tokenless && g.admit.attest.mode() == "" {
			g.log.Warn("lease of the previous run not restored: it joined by its MUNGE credential alone, and attested identity is off now", "lease", r.ID)
			if err := g.st.RecordLeaseEnd(r.ID, now, "attested identity off"); err != nil {
				return restored, closed, err
			}
			closed++
			continue
		}
		if !tokenless && !live[r.Token] && !byBearer {
			g.log.Warn("lease of the previous run not restored: its token was revoked or expired meanwhile", "lease", r.ID, "token", r.Token)
			if err := g.st.RecordLeaseEnd(r.ID, now, "token "+r.Token+" revoked or expired"); err != nil {
				return restored, closed, err
			}
			closed++
			continue
		}
		if err := g.restore(r, now); err != nil {
			g.log.Warn("cannot restore a lease of the previous run; its job must join again", "lease", r.ID, "addr", r.TunnelAddr, "err", err)
			if err := g.st.RecordLeaseEnd(r.ID, now, "gateway restarted"); err != nil {
				return restored, closed, err
			}
			closed++
			continue
		}
		restored++
	}
	return restored, closed, nil
}

// restore takes back lease r of the previous run: lease → egress backend
// (AddJob) → WireGuard peer, with one deferred rollback like Join.
func (g *gateway) restore(r store.LeaseRecord, now time.Time) (err error) {
	l, secretHash, expose, err := g.leaseOfRecord(r, now)
	if err != nil {
		return err
	}
	if l, err = g.leases.Restore(l, secretHash); err != nil {
		return err
	}
	added := false
	defer func() {
		if err == nil {
			return
		}
		_, _ = g.leases.Remove(l.ID)
		if added {
			g.removeJob(l)
		}
	}()
	job, err := g.jobOf(l, r.JobID, r.Token, expose)
	if err != nil {
		return err
	}
	if err = g.addJob(job); err != nil {
		return fmt.Errorf("add job to egress: %w", err)
	}
	added = true
	if err = g.wg.AddPeer(l.PublicKey, l.AddrList()...); err != nil {
		return err
	}
	if from, err := netip.ParseAddrPort(r.Remote); err == nil {
		g.wg.CountFrom(l.PublicKey, from.Addr()) // the endpoint restored next, if any, takes over
	}
	g.restoreEndpoint(l.PublicKey)
	g.log.Info("lease restored", "lease", l.ID, "addrs", l.Addrs, "ports", g.egress.block(l), "job", r.JobID, "host", r.Host, "expires", l.Expires)
	return nil
}

// leaseOfRecord rebuilds the lease of record r of the previous run, to
// expire a TTL after now, with its secret's hash and the ports it exposed,
// from the record's resume state; its port blocks must be where the egress
// plan of this run puts them.
func (g *gateway) leaseOfRecord(r store.LeaseRecord, now time.Time) (lease.Lease, [32]byte, []control.Port, error) {
	rs := r.Resume
	if rs == nil {
		return lease.Lease{}, [32]byte{}, nil, fmt.Errorf("no resume state (recorded by an older version)")
	}
	pub, err := wgkey.Parse(rs.PublicKey)
	if err != nil {
		return lease.Lease{}, [32]byte{}, nil, err
	}
	if len(rs.SecretHash) != sha256.Size {
		return lease.Lease{}, [32]byte{}, nil, fmt.Errorf("bad secret hash")
	}
	l := lease.Lease{
		ID: r.ID, Addrs: []netip.Prefix{netip.PrefixFrom(r.TunnelAddr(), g.cfg.subnet().Bits())}, Block: rs.Block, Blocks: rs.Blocks,
		PublicKey: pub, Start: r.Start, Expires: now.Add(g.leases.TTL()),
	}
	remote, _ := netip.ParseAddrPort(r.Remote)
	l.Owner = identity.Job{Claimed: identity.Claimed{BatchJobID: r.JobID, BatchSystem: r.BatchSystem, Hostname: r.Host, User: r.User, UID: r.UID, Command: r.Command},
		Token: r.Token, Remote: remote, Attested: r.Attested, Issued: r.Issued}
	if rs.Block >= 0 && rs.Blocks == 0 {
		l.Blocks = 1
	}
	if err := g.egress.checkRestored(l, r); err != nil {
		return lease.Lease{}, [32]byte{}, nil, err
	}
	var expose []control.Port
	for _, s := range rs.Expose {
		p, err := control.ParsePort(s)
		if err != nil {
			return lease.Lease{}, [32]byte{}, nil, fmt.Errorf("expose %q: %w", s, err)
		}
		expose = append(expose, p)
	}
	return l, [32]byte(rs.SecretHash), expose, nil
}
