// SPDX-License-Identifier: MIT

package tunnel

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/wgkey"
	// wireguard-go's device package with smaller per-peer state
	// (third_party/wireguard-go/README.md).
	"github.com/airlock-vpn/airlock/third_party/wireguard-go/device"
)

// KeepaliveInterval is the persistent keepalive the client asks for. It keeps
// NAT and firewall state on the path open and makes the first handshake start
// as soon as the device is up.
const KeepaliveInterval = 25 * time.Second

// wgLogger adapts wireguard-go's printf logger to slog: its verbose lines go
// to Debug, its errors to Warn (they are about peers and packets, not about
// the process).
func wgLogger(l *slog.Logger) *device.Logger {
	return &device.Logger{
		// wireguard-go logs every handshake and peer change at this
		// level; formatting them only for a logger that shows them took
		// 2 % of a join storm's CPU (peers' names are base64 of their
		// keys).
		Verbosef: func(format string, args ...any) {
			if !l.Enabled(context.Background(), slog.LevelDebug) {
				return
			}
			l.Debug(fmt.Sprintf(format, args...), "component", "wireguard")
		},
		Errorf: func(format string, args ...any) {
			l.Warn(fmt.Sprintf(format, args...), "component", "wireguard")
		},
	}
}

// mtuTUN overrides the MTU a tun.Device reports. A TUN fd handed over from
// another network namespace cannot answer MTU() itself: wireguard-go looks
// the device up by name in the current namespace.
type mtuTUN struct {
	tun.Device
	mtu int
}

func (t mtuTUN) MTU() (int, error) { return t.mtu, nil }

// WithMTU returns dev reporting mtu from MTU().
func WithMTU(dev tun.Device, mtu int) tun.Device { return mtuTUN{Device: dev, mtu: mtu} }

// Gateway is the gateway's WireGuard device: one UDP port, one peer per
// lease. It is safe for concurrent use.
type Gateway struct {
	dev    *device.Device
	port   uint16
	budget *sourceBudget // handshakes a source may start under load (sourcebudget.go)
}

// NewGateway starts a WireGuard device on dev, listening on UDP port (0 picks
// one), with private key priv. readers goroutines read dev at once (below 1:
// one); more than one needs a dev whose Read may be called concurrently,
// e.g. a multi-queue TUN (internal/mqtun) with one reader per queue. The
// device owns dev and closes it on Close.
func NewGateway(logger *slog.Logger, dev tun.Device, readers int, bind conn.Bind, priv wgkey.Key, port uint16) (*Gateway, error) {
	if bind == nil {
		bind = conn.NewStdNetBind()
	}
	d := device.NewDeviceReaders(dev, bind, wgLogger(logger), readers)
	// One peer per job: a job's backlog waits in its own queue, bounded
	// by delay (CoDel), and jobs take turns (third_party/wireguard-go,
	// fairqueue.go).
	d.SetFairQueue(0, 0)
	budget := newSourceBudget(time.Now)
	d.SetHandshakeLimiter(budget)
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=%d\n", priv.Hex(), port)
	if err := d.IpcSet(cfg); err != nil {
		d.Close()
		return nil, fmt.Errorf("configure wireguard device on udp port %d: %w", port, err)
	}
	if err := d.Up(); err != nil {
		d.Close()
		return nil, fmt.Errorf("bring wireguard device up on udp port %d: %w", port, err)
	}
	g := &Gateway{dev: d, port: port, budget: budget}
	if port == 0 {
		p, err := g.listenPort()
		if err != nil {
			d.Close()
			return nil, err
		}
		g.port = p
	}
	return g, nil
}

// Port returns the UDP port the device listens on.
func (g *Gateway) Port() uint16 { return g.port }

// QueueDrops returns how many packets to jobs the device's per-job queues
// dropped: CoDel's drops of a job whose own backlog waited too long, and
// batches over a job's queue limit.
func (g *Gateway) QueueDrops() uint64 { return g.dev.FairQueueDrops() }

func (g *Gateway) listenPort() (uint16, error) {
	s, err := g.dev.IpcGet()
	if err != nil {
		return 0, fmt.Errorf("read wireguard config: %w", err)
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "listen_port="); ok {
			p, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return 0, fmt.Errorf("parse listen_port %q: %w", v, err)
			}
			return uint16(p), nil
		}
	}
	return 0, fmt.Errorf("read wireguard config: no listen_port")
}

// AddPeer admits the peer with public key pub, routing addrs (each a /32
// or /128) to it.
func (g *Gateway) AddPeer(pub wgkey.Key, addrs ...netip.Addr) error {
	cfg := fmt.Sprintf("public_key=%s\nreplace_allowed_ips=true\n", pub.Hex())
	for _, addr := range addrs {
		cfg += fmt.Sprintf("allowed_ip=%s\n", netip.PrefixFrom(addr, addr.BitLen()))
	}
	if err := g.dev.IpcSet(cfg); err != nil {
		return fmt.Errorf("add wireguard peer %s: %w", pub, err)
	}
	g.budget.place(pub, netip.Addr{})
	return nil
}

// CountFrom counts peer pub behind source address from in the handshake
// budget under load (sourcebudget.go) until its first authenticated
// packet says where it is: the address its job joined from. A peer not
// added (or removed meanwhile) is ignored.
func (g *Gateway) CountFrom(pub wgkey.Key, from netip.Addr) { g.budget.move(pub, from) }

// SetEndpoint tells the device where peer pub was last heard (a UDP
// address), so that it can start a handshake with it (Initiate); an unknown
// peer is not added.
func (g *Gateway) SetEndpoint(pub wgkey.Key, ep netip.AddrPort) error {
	cfg := fmt.Sprintf("public_key=%s\nupdate_only=true\nendpoint=%s\n", pub.Hex(), ep)
	if err := g.dev.IpcSet(cfg); err != nil {
		return fmt.Errorf("set endpoint of wireguard peer %s: %w", pub, err)
	}
	g.budget.move(pub, ep.Addr())
	return nil
}

// Initiate starts a handshake with peer pub at its endpoint (SetEndpoint),
// as a client would; wireguard-go retries it every 5 s for 90 s if no
// answer comes. It fails for an unknown peer or one without an endpoint.
func (g *Gateway) Initiate(pub wgkey.Key) error {
	peer := g.dev.LookupPeer(device.NoisePublicKey(pub))
	if peer == nil {
		return fmt.Errorf("initiate handshake: unknown wireguard peer %s", pub)
	}
	if err := peer.SendHandshakeInitiation(false); err != nil {
		return fmt.Errorf("initiate handshake with wireguard peer %s: %w", pub, err)
	}
	return nil
}

// UnderLoad reports whether the device counts itself under load: so many
// handshakes queued that it answers new ones with cookies and admits at
// a source address's budget (wireguard-go's DoS protection; the budget
// grows with the peers behind the address, sourcebudget.go).
func (g *Gateway) UnderLoad() bool { return g.dev.IsUnderLoad() }

// RemovePeer removes the peer with public key pub; unknown keys are ignored.
func (g *Gateway) RemovePeer(pub wgkey.Key) {
	g.dev.RemovePeer(device.NoisePublicKey(pub))
	g.budget.forget(pub)
}

// Close stops the device, its UDP sockets and its TUN.
func (g *Gateway) Close() { g.dev.Close() }

// Client is the job side's WireGuard device with the gateway as its only
// peer, routing everything to it; its data path runs to completion (each
// batch is encrypted or decrypted by the goroutine that read it). It is
// safe for concurrent use.
type Client struct {
	dev *device.Device

	mu   sync.Mutex
	peer wgkey.Key // guarded by mu: the gateway's public key
}

// NewClient starts a WireGuard device on dev with private key priv and the
// gateway peer (public key, UDP endpoint). The device owns dev and closes it
// on Close. The first handshake starts at once.
func NewClient(logger *slog.Logger, dev tun.Device, bind conn.Bind, priv, gateway wgkey.Key, endpoint netip.AddrPort) (*Client, error) {
	if bind == nil {
		bind = conn.NewStdNetBind()
	}
	d := device.NewDevice(dev, bind, wgLogger(logger))
	// One peer: encrypt and send in the goroutine that read the TUN,
	// decrypt and write in the one that read the socket, with no hand-off
	// (third_party/wireguard-go, inline.go).
	d.SetRunToCompletion(true)
	cfg := fmt.Sprintf("private_key=%s\nlisten_port=0\npublic_key=%s\nendpoint=%s\nallowed_ip=0.0.0.0/0\nallowed_ip=::/0\n",
		priv.Hex(), gateway.Hex(), endpoint)
	if err := d.IpcSet(cfg); err != nil {
		d.Close()
		return nil, fmt.Errorf("configure wireguard device: %w", err)
	}
	if err := d.Up(); err != nil {
		d.Close()
		return nil, fmt.Errorf("bring wireguard device up: %w", err)
	}
	// Setting the keepalive on an up device sends one at once, which starts
	// the handshake before the job's first packet.
	ka := fmt.Sprintf("public_key=%s\npersistent_keepalive_interval=%d\n", gateway.Hex(), int(KeepaliveInterval/time.Second))
	if err := d.IpcSet(ka); err != nil {
		d.Close()
		return nil, fmt.Errorf("configure wireguard keepalive: %w", err)
	}
	return &Client{dev: d, peer: gateway}, nil
}

// SetGateway replaces the gateway peer by gateway at endpoint, with fresh
// handshake state, and starts a handshake at once. Sessions with the old
// peer and packets queued for it are dropped. The client calls it when the
// gateway lost its session (a restart) or when it moves to another gateway.
func (c *Client) SetGateway(gateway wgkey.Key, endpoint netip.AddrPort) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.dev.RemovePeer(device.NoisePublicKey(c.peer))
	cfg := fmt.Sprintf("public_key=%s\nendpoint=%s\nallowed_ip=0.0.0.0/0\nallowed_ip=::/0\n", gateway.Hex(), endpoint)
	if err := c.dev.IpcSet(cfg); err != nil {
		return fmt.Errorf("configure wireguard peer: %w", err)
	}
	c.peer = gateway
	ka := fmt.Sprintf("public_key=%s\npersistent_keepalive_interval=%d\n", gateway.Hex(), int(KeepaliveInterval/time.Second))
	if err := c.dev.IpcSet(ka); err != nil {
		return fmt.Errorf("configure wireguard keepalive: %w", err)
	}
	return nil
}

// SetPrivateKey replaces the client's private key. Sessions made with the
// old key are dropped; the next packet (or keepalive) starts a handshake
// with the new one. The client calls it when a gateway says another client
// holds its public key.
func (c *Client) SetPrivateKey(priv wgkey.Key) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.dev.IpcSet("private_key=" + priv.Hex() + "\n"); err != nil {
		return fmt.Errorf("set wireguard private key: %w", err)
	}
	return nil
}

// PublicKey returns the public key of the private key the device uses,
// or the zero Key if it cannot be read.
func (c *Client) PublicKey() wgkey.Key {
	s, err := c.dev.IpcGet()
	if err != nil {
		return wgkey.Key{}
	}
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "private_key="); ok {
			var k wgkey.Key
			if b, err := hex.DecodeString(v); err == nil && len(b) == len(k) {
				copy(k[:], b)
				return k.PublicKey()
			}
		}
	}
	return wgkey.Key{}
}

// LastHandshake returns when the last handshake with the gateway completed,
// or the zero time if none has.
func (c *Client) LastHandshake() time.Time {
	s, err := c.dev.IpcGet()
	if err != nil {
		return time.Time{}
	}
	var sec, nsec int64
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "last_handshake_time_sec="); ok {
			sec, _ = strconv.ParseInt(v, 10, 64)
		} else if v, ok := strings.CutPrefix(line, "last_handshake_time_nsec="); ok {
			nsec, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if sec == 0 && nsec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, nsec)
}

// Close stops the device, its UDP socket and its TUN.
func (c *Client) Close() { c.dev.Close() }
