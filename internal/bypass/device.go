// SPDX-License-Identifier: MIT

package bypass

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"
	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/forward/netstack"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

// Device is the netns mode's TUN decorator: it diverts the job's packets
// to bypassed destinations (and its DNS queries for local domains) from
// the WireGuard device into a netstack in the client, and writes that
// netstack's packets back to the job. See the package comment.
//
// Read is called by one goroutine (wireguard-go's), as for any tun.Device;
// the other methods are safe for concurrent use.
type Device struct {
	tun.Device
	eng *Engine
	log *slog.Logger
	// job and dns are, by family, the job's address and its resolver
	// (the gateway's tunnel address) in its namespace (zero: none).
	job, dns  [ipfamily.N]netip.Addr
	mtu       int
	pumpDone  chan struct{}
	closeOnce sync.Once

	// st is the netstack, created when the first packet is diverted;
	// origin the stack that reaches the gateway's resolver as the job
	// (origin.go), made with it where the TUN can wake Read (file).
	mu       sync.Mutex // guards creating st and startErr
	st       atomic.Pointer[netstack.Stack]
	origin   atomic.Pointer[originStack]
	startErr error
	// file is the job's TUN's file, whose read deadline interrupts a Read
	// blocked on it when the origin stack has packets (nil: no DNS over
	// TCP diverted); blocked says a Read waits on it.
	file    *os.File
	blocked atomic.Bool

	// Read's scratch, owned by the reading goroutine.
	div  [][]byte
	mark []bool
}

// offset is where packets start in the pump's buffers (room for the
// TUN's virtio-net header).
const offset = 16

// Wrap returns dev decorated for bypass: jobs are the job's addresses (at
// most one per family), dns its resolver's (the gateway's tunnel
// addresses), mtu the tunnel's. The Device closes dev when it is closed.
func (e *Engine) Wrap(dev tun.Device, jobs, dns []netip.Addr, mtu int) (*Device, error) {
	d := &Device{Device: dev, eng: e, log: e.log, mtu: mtu}
	if f, ok := dev.(interface{ File() *os.File }); ok {
		d.file = f.File()
	}
	for _, a := range jobs {
		if f := ipfamily.Of(a); f != nil {
			d.job[f.Index] = a.Unmap()
		}
	}
	for _, a := range dns {
		if f := ipfamily.Of(a); f != nil {
			d.dns[f.Index] = a.Unmap()
		}
	}
	if err := d.update(e.Set()); err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.dev = d
	e.mu.Unlock()
	return d, nil
}

// update hands a new set to the netstack, if it runs.
func (d *Device) update(s *Set) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.st.Load(); st != nil {
		return st.SetPolicy(s.Policy())
	}
	return nil
}

// stack returns the netstack, starting it on first use (nil if it cannot
// start).
func (d *Device) stack() *netstack.Stack {
	if st := d.st.Load(); st != nil {
		return st
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if st := d.st.Load(); st != nil || d.startErr != nil {
		return st
	}
	st, err := d.start(d.eng.Set())
	if err != nil {
		d.startErr = err
		d.log.Error("site-local bypass unavailable: its flows are dropped", "err", err)
		return nil
	}
	return st
}

// start creates the netstack and the pump that writes its packets to the
// job. The job's TCP is terminated by the kernel of a private namespace
// (internal/usernet, as in the user-mode gateway) where this user may
// create one, else by the netstack.
func (d *Device) start(s *Set) (*netstack.Stack, error) {
	var jobs, selves []netip.Prefix
	for _, f := range ipfamily.All {
		if a := d.job[f.Index]; a.IsValid() {
			jobs = append(jobs, netip.PrefixFrom(a, f.Bits))
		}
		if a := d.dns[f.Index]; a.IsValid() {
			selves = append(selves, netip.PrefixFrom(a, f.Bits))
		}
	}
	ups := s.Resolvers()
	if len(ups) == 0 && len(selves) > 0 {
		// No local domains (yet): no query is diverted; the netstack
		// still needs an upstream to start.
		ups = []netip.AddrPort{netip.AddrPortFrom(selves[0].Addr(), 53)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	ktcp, err := usernet.Open(ctx, jobs, d.mtu, 1) // one job: one queue
	cancel()
	if err != nil {
		d.log.Debug("site-local bypass: no kernel TCP, the netstack's instead", "err", err)
		ktcp = nil
	}
	if d.file != nil {
		o, err := newOriginStack(d.job, d.mtu, d.wake)
		if err != nil {
			d.log.Debug("site-local bypass: DNS over TCP to the gateway's resolver unavailable", "err", err)
		} else {
			d.origin.Store(o)
		}
	}
	st, err := netstack.New(netstack.Config{
		KernelTCP:    ktcp,
		DNSRoute:     d.routeDNS,
		Logger:       slog.New(quiet{d.log.Handler()}),
		Addrs:        selves,
		MTU:          d.mtu,
		DNSUpstreams: ups,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return nil, err
			}
			return d.eng.Dial(ctx, network, ap)
		},
	})
	if err != nil {
		d.closeOrigin()
		return nil, fmt.Errorf("site-local bypass: %w", err)
	}
	if err := st.SetPolicy(s.Policy()); err != nil {
		st.Close()
		d.closeOrigin()
		return nil, err
	}
	d.st.Store(st)
	d.pumpDone = make(chan struct{})
	go d.pump(st)
	d.log.Debug("site-local bypass stack started", "job", jobs, "dns", selves)
	return st, nil
}

// pump writes the netstack's packets to the job's TUN until the netstack
// closes.
func (d *Device) pump(st *netstack.Stack) {
	defer close(d.pumpDone)
	const batch = 64
	bufs := make([][]byte, batch)
	for i := range bufs {
		bufs[i] = make([]byte, offset+65535)
	}
	sizes := make([]int, batch)
	for {
		n, err := st.Read(bufs, sizes, offset)
		if err != nil {
			return
		}
		out := bufs[:n]
		for i := range out {
			out[i] = out[i][:offset+sizes[i]]
		}
		if _, err := d.Device.Write(out, offset); err != nil && !errors.Is(err, os.ErrClosed) {
			d.log.Debug("bypass: write to the job's tun", "err", err)
		}
		for i := range out {
			out[i] = out[i][:cap(out[i])]
		}
	}
}

// Read implements tun.Device: it returns the origin stack's packets for
// the gateway first, then reads the job's packets and keeps those it
// diverts to the netstack out of what it returns.
func (d *Device) Read(bufs [][]byte, sizes []int, off int) (int, error) {
	for {
		o := d.origin.Load()
		if o != nil {
			d.blocked.Store(true)
			if n := o.read(bufs, sizes, off); n > 0 {
				d.blocked.Store(false)
				return n, nil
			}
		}
		n, err := d.Device.Read(bufs, sizes, off)
		if o != nil {
			d.blocked.Store(false)
			if errors.Is(err, os.ErrDeadlineExceeded) {
				d.file.SetReadDeadline(time.Time{})
				if n == 0 {
					continue
				}
				err = nil
			}
		}
		s := d.eng.Set()
		if n == 0 || s.IsEmpty() && d.st.Load() == nil {
			return n, err
		}
		n = d.divert(s, bufs, sizes, off, n)
		if n > 0 || err != nil {
			return n, err
		}
	}
}

// wake interrupts a Read blocked on the job's TUN: the origin stack has
// packets for the gateway.
func (d *Device) wake() {
	if d.blocked.Load() {
		d.file.SetReadDeadline(time.Unix(1, 0))
	}
}

// Write implements tun.Device: the gateway's packets to the origin stack's
// ports go to it, the rest to the job.
func (d *Device) Write(bufs [][]byte, off int) (int, error) {
	o := d.origin.Load()
	if o == nil || !slices.ContainsFunc(bufs, func(b []byte) bool { return off < len(b) && o.takes(b[off:]) }) {
		return d.Device.Write(bufs, off)
	}
	keep := make([][]byte, 0, len(bufs))
	for _, b := range bufs {
		if off < len(b) && o.takes(b[off:]) {
			o.deliver(b[off:])
			continue
		}
		keep = append(keep, b)
	}
	if len(keep) == 0 {
		return len(bufs), nil
	}
	if _, err := d.Device.Write(keep, off); err != nil {
		return 0, err
	}
	return len(bufs), nil
}

// routeDNS is the bypass netstack's DNS route: a query over TCP (a
// connection to the job's resolver that diverts took whole) for a name
// outside the local domains goes to the gateway's resolver through the
// tunnel, as the job (origin stack); everything else to the site
// resolvers.
func (d *Device) routeDNS(ctx context.Context, req *dns.Msg, network string) (*dns.Msg, bool, error) {
	if network != "tcp" || len(req.Question) != 1 || d.eng.Set().IsLocal(req.Question[0].Name) {
		return nil, false, nil
	}
	o := d.origin.Load()
	if o == nil {
		return nil, true, errors.New("dns over tcp: no way to the gateway's resolver")
	}
	for _, f := range ipfamily.All {
		if !d.dns[f.Index].IsValid() || !d.job[f.Index].IsValid() {
			continue
		}
		c, err := o.dialTCP(ctx, netip.AddrPortFrom(d.dns[f.Index], 53))
		if err != nil {
			return nil, true, fmt.Errorf("dns over tcp to the gateway's resolver: %w", err)
		}
		defer c.Close()
		if dl, ok := ctx.Deadline(); ok {
			c.SetDeadline(dl)
		}
		conn := &dns.Conn{Conn: c}
		if err := conn.WriteMsg(req); err != nil {
			return nil, true, err
		}
		resp, err := conn.ReadMsg()
		return resp, true, err
	}
	return nil, true, errors.New("dns over tcp: the job has no address of its resolver's family")
}

// closeOrigin stops the origin stack, if any.
func (d *Device) closeOrigin() {
	if o := d.origin.Swap(nil); o != nil {
		o.close()
	}
}

// divert moves the packets bufs[:n] that s bypasses into the netstack and
// compacts the rest to the front; it returns how many are left.
func (d *Device) divert(s *Set, bufs [][]byte, sizes []int, off, n int) int {
	if cap(d.mark) < n {
		d.mark = make([]bool, n)
	}
	mark := d.mark[:n]
	d.div = d.div[:0]
	for i := 0; i < n; i++ {
		pkt := bufs[i][off : off+sizes[i]]
		mark[i] = d.diverts(s, pkt)
		if mark[i] {
			d.div = append(d.div, bufs[i][:off+sizes[i]])
		}
	}
	if len(d.div) == 0 {
		return n
	}
	if st := d.stack(); st != nil {
		st.Write(d.div, off) // copies (the kernel TCP path may write headers before off)
	}
	k := 0
	for i := 0; i < n; i++ {
		if mark[i] {
			continue
		}
		if k != i {
			copy(bufs[k][off:], bufs[i][off:off+sizes[i]])
			sizes[k] = sizes[i]
		}
		k++
	}
	return k
}

// diverts decides one packet from the job: from the job's own address of
// its family to a destination an entry matches (fragments: any to an
// entry's prefixes, so that the netstack reassembles them and checks the
// whole datagram), or a UDP DNS query to the job's resolver for a local
// name. IPv6 packets with extension headers other than a fragment header
// go to the gateway.
func (d *Device) diverts(s *Set, pkt []byte) bool {
	f := ipfamily.OfPacket(pkt)
	if f == nil || len(pkt) < f.HeaderLen {
		return false
	}
	src, dst := f.Addr(pkt, f.SrcOff), f.Addr(pkt, f.DstOff)
	if src != d.job[f.Index] {
		return false
	}
	var off int
	var proto uint8
	var frag bool
	if f == ipfamily.V4 {
		off, proto = int(pkt[0]&0x0f)*4, pkt[f.ProtoOff]
		if off < f.HeaderLen || len(pkt) < off {
			return false
		}
		frag = binary.BigEndian.Uint16(pkt[6:8])&0x3fff != 0 // MF or an offset
	} else {
		off, proto = f.HeaderLen, pkt[f.ProtoOff]
		if proto == ipv6Fragment {
			if len(pkt) < f.HeaderLen+8 {
				return false
			}
			off, proto, frag = f.HeaderLen+8, pkt[f.HeaderLen], true
		}
	}
	if dst == d.dns[f.Index] {
		switch {
		case frag || len(pkt) < off+8 || binary.BigEndian.Uint16(pkt[off+2:off+4]) != 53:
			return false
		case proto == 17:
			return s.IsLocal(QueryName(pkt[off+8:]))
		case proto == 6:
			// DNS over TCP: the whole connection, when there are
			// local names to answer and the gateway's resolver can
			// be reached for the rest (routeDNS).
			return d.file != nil && s.HasLocal()
		}
		return false
	}
	if !s.Covers(dst) {
		return false
	}
	if frag {
		return proto == 6 || proto == 17
	}
	switch proto {
	case 6, 17:
		if len(pkt) < off+4 {
			return false
		}
		pp := policy.ProtoTCP
		if proto == 17 {
			pp = policy.ProtoUDP
		}
		_, ok := s.Match(pp, dst, binary.BigEndian.Uint16(pkt[off+2:off+4]))
		return ok
	case f.ICMP:
		_, ok := s.Match(policy.ProtoICMP, dst, 0)
		return ok
	}
	return false
}

// ipv6Fragment is IPv6's fragment header (next header 44).
const ipv6Fragment = 44

// QueryName returns the question name of a DNS query message, or "".
func QueryName(msg []byte) string {
	if len(msg) < 12 || msg[2]&0x80 != 0 || binary.BigEndian.Uint16(msg[4:6]) == 0 {
		return ""
	}
	var b strings.Builder
	for i := 12; i < len(msg); {
		l := int(msg[i])
		if l == 0 {
			return b.String()
		}
		if l > 63 || i+1+l > len(msg) || b.Len()+l > 253 {
			return ""
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.Write(msg[i+1 : i+1+l])
		i += 1 + l
	}
	return ""
}

// Close implements tun.Device: it stops the netstack (open bypassed flows
// end) and closes the TUN.
func (d *Device) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		st := d.st.Load()
		d.mu.Unlock()
		if st != nil {
			st.Close()
			<-d.pumpDone
		}
		d.closeOrigin()
		d.eng.mu.Lock()
		if d.eng.dev == d {
			d.eng.dev = nil
		}
		d.eng.mu.Unlock()
	})
	return d.Device.Close()
}

// quiet is a slog handler that logs one level lower: the netstack's
// lifecycle lines are the gateway's Info and Warn, but only Debug in a
// job's client.
type quiet struct{ slog.Handler }

func (q quiet) Enabled(ctx context.Context, l slog.Level) bool {
	return q.Handler.Enabled(ctx, l-4)
}

func (q quiet) Handle(ctx context.Context, r slog.Record) error {
	r.Level -= 4
	return q.Handler.Handle(ctx, r)
}

func (q quiet) WithAttrs(as []slog.Attr) slog.Handler { return quiet{q.Handler.WithAttrs(as)} }
func (q quiet) WithGroup(n string) slog.Handler       { return quiet{q.Handler.WithGroup(n)} }
