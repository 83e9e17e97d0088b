package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/lease"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// gateway is the control server's Backend: it turns joins into leases and
// WireGuard peers. It is safe for concurrent use.
type gateway struct {
	log       *slog.Logger
	cfg       Config
	leases    *lease.Manager
	wg        *tunnel.Gateway
	wgPub     tunnel.Key
	gwAddr    netip.Addr
	advertise string
}

// owner is what a lease records about its holder.
type owner struct {
	Job    control.JobInfo
	Token  string
	Remote netip.AddrPort
}

func (g *gateway) Join(ctx context.Context, req control.JoinRequest, tok store.Token, remote netip.AddrPort) (control.Lease, error) {
	pub, err := tunnel.ParseKey(req.PublicKey)
	if err != nil {
		return control.Lease{}, fmt.Errorf("%w: %w", control.ErrBadRequest, err)
	}
	now := time.Now()
	l, secret, replaced, err := g.leases.Allocate(pub, owner{Job: req.Job, Token: tok.Name, Remote: remote}, now)
	if replaced != nil {
		g.wg.RemovePeer(replaced.PublicKey)
		g.log.Info("lease replaced by a new join with the same key", "lease", replaced.ID, "addr", replaced.Addr)
	}
	if errors.Is(err, lease.ErrNoAddress) {
		g.log.Error("join refused: tunnel subnet exhausted; widen --subnet", "subnet", g.cfg.Subnet, "leases", g.leases.Len())
		return control.Lease{}, fmt.Errorf("%w: all addresses of %s are leased", control.ErrNoAddress, g.cfg.Subnet)
	}
	if err != nil {
		return control.Lease{}, err
	}
	if err := g.wg.AddPeer(pub, l.Addr); err != nil {
		_, _ = g.leases.Release(l.ID, secret)
		return control.Lease{}, err
	}
	g.log.Info("job joined", "lease", l.ID, "addr", l.Addr, "job", req.Job.BatchJobID,
		"batch", req.Job.BatchSystem, "user", req.Job.User, "uid", req.Job.UID,
		"host", req.Job.Hostname, "token", tok.Name, "remote", remote)
	return control.Lease{
		ID:               l.ID,
		Secret:           secret,
		Address:          netip.PrefixFrom(l.Addr, g.cfg.Subnet.Bits()),
		Gateway:          g.gwAddr,
		DNS:              []netip.Addr{g.gwAddr},
		MTU:              g.cfg.MTU,
		GatewayPublicKey: g.wgPub.String(),
		Endpoint:         g.advertise,
		RenewInterval:    control.Duration(g.cfg.RenewInterval),
		Expires:          l.Expires,
	}, nil
}

func (g *gateway) Renew(ctx context.Context, ref control.LeaseRef) (control.RenewResponse, error) {
	l, err := g.leases.Renew(ref.ID, ref.Secret, time.Now())
	if err != nil {
		return control.RenewResponse{}, fmt.Errorf("%w: %w", control.ErrUnknownLease, err)
	}
	return control.RenewResponse{Expires: l.Expires}, nil
}

func (g *gateway) Release(ctx context.Context, ref control.LeaseRef) error {
	l, err := g.leases.Release(ref.ID, ref.Secret)
	if err != nil {
		return fmt.Errorf("%w: %w", control.ErrUnknownLease, err)
	}
	g.wg.RemovePeer(l.PublicKey)
	g.log.Info("job left", "lease", l.ID, "addr", l.Addr, "held", time.Since(l.Start).Round(time.Millisecond))
	return nil
}

func (g *gateway) Health() control.Health {
	return control.Health{Jobs: g.leases.Len()}
}

// expireLoop frees leases whose clients stopped renewing.
func (g *gateway) expireLoop(ctx context.Context) {
	every := g.leases.TTL() / 4
	if every > 5*time.Second {
		every = 5 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, l := range g.leases.Expire(now) {
				g.wg.RemovePeer(l.PublicKey)
				g.log.Info("lease expired: client stopped renewing", "lease", l.ID, "addr", l.Addr)
			}
		}
	}
}
