// SPDX-License-Identifier: MIT

package netstack

// Inbound exposure (`airlock run --expose`) in user mode.
//
// Theory of operation: for every exposure the Stack opens a host socket on
// the public port of the job's egress address (Exposure.PublicAddr; its
// family's unspecified address: the Stack's Egress of the family), the
// address the gateway announces, and on no other address of the host
// (never its loopback or management addresses; without an egress address
// of the family, AddJob with exposures fails), as the gateway's user;
// nothing is done by the kernel on the jobs' behalf. The job's side is
// its tunnel address of the exposure's family. TCP: each accepted
// connection is carried into the netstack with a gonet dial to JOB:PORT; if the job refuses or does not answer
// within exposeDialTimeout the outside client gets a reset. Data is copied
// both ways with half-close, like outgoing flows. UDP: one netstack socket
// connected to JOB:PORT per outside peer (IP:port), created on the peer's
// first datagram and closed after UDPIdleTimeout without a reply from the
// job or a datagram from the peer; the job's replies go back to the peer
// from the public socket.
//
// Inside the tunnel the connections come from the gateway's tunnel address
// (the netstack picks it as the source of its dials), not from the outside
// client: the job sees every inbound connection as coming from the
// gateway. Kernel mode, which DNATs, shows the client's real address.
//
// Per-job state lives in the Stack's exposeTable, which is registered with
// the Stack through track, so Stack.Close closes every listener and carried
// connection.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

const (
	// exposeDialTimeout bounds connecting to the job for one inbound TCP
	// connection.
	exposeDialTimeout = 5 * time.Second
	// maxExposeUDPFlows caps the outside peers of one UDP exposure; the
	// datagrams of further peers are dropped.
	maxExposeUDPFlows = 256
)

// exposeTable holds the exposures of one Stack's jobs. It is safe for
// concurrent use.
type exposeTable struct {
	mu     sync.Mutex
	closed bool
	jobs   map[jobs.ID][]*exposure
}

func newExposeTable() *exposeTable {
	return &exposeTable{jobs: make(map[jobs.ID][]*exposure)}
}

// Close closes every exposure; called by Stack.Close through track.
func (t *exposeTable) Close() error {
	t.mu.Lock()
	t.closed = true
	jobs := t.jobs
	t.jobs = nil
	t.mu.Unlock()
	for _, ex := range jobs {
		for _, e := range ex {
			e.Close()
		}
	}
	return nil
}

// expose opens a host listener for every exposure of job id and carries
// what arrives into the netstack to the job's port at its tunnel address
// of the exposure's family. The job's previous exposures are closed first.
func (s *Stack) expose(id jobs.ID, ex []forward.Exposure) error {
	j, ok := s.reg.Get(id)
	if !ok {
		return fmt.Errorf("expose: %w", forward.ErrUnknownJob)
	}
	for _, x := range ex {
		if err := forward.CheckExposure(x); err != nil {
			return err
		}
	}
	s.unexpose(id)
	var opened []*exposure
	for _, x := range ex {
		addr, ok := j.AddrOf(x.Family())
		if !ok {
			for _, o := range opened {
				o.Close()
			}
			return fmt.Errorf("expose %s/%d at %v: the job has no %s tunnel address", x.Proto, x.JobPort, x.PublicAddr, x.Family())
		}
		e, err := s.openExposure(id, addr, x)
		if err != nil {
			for _, o := range opened {
				o.Close()
			}
			return err
		}
		opened = append(opened, e)
	}
	t := s.exposed
	t.mu.Lock()
	closed := t.closed
	if !closed {
		t.jobs[id] = opened
	}
	t.mu.Unlock()
	if closed {
		for _, o := range opened {
			o.Close()
		}
		return errors.New("expose: netstack closed")
	}
	for _, e := range opened {
		e.start()
		s.log.Info("exposed job port", "job", id, "addr", e.job, "proto", e.x.Proto, "job_port", e.x.JobPort, "listen", e.listenAddr)
	}
	return nil
}

// unexpose closes the job's listeners and the connections and flows they
// carried.
func (s *Stack) unexpose(id jobs.ID) {
	t := s.exposed
	t.mu.Lock()
	ex := t.jobs[id]
	delete(t.jobs, id)
	t.mu.Unlock()
	for _, e := range ex {
		e.Close()
	}
	if len(ex) > 0 {
		s.log.Info("job's ports no longer exposed", "job", id, "exposures", len(ex))
	}
}

// exposure is one open mapping: its host socket and what it carries.
type exposure struct {
	s          *Stack
	id         jobs.ID
	job        netip.Addr // the job's tunnel address of the exposure's family
	x          forward.Exposure
	listenAddr string
	ln         *net.TCPListener // tcp
	pc         *net.UDPConn     // udp
	ctx        context.Context  // cancelled by Close; bounds dials
	cancel     context.CancelFunc

	// mu guards closed and conns, the carried connections and flows.
	mu     sync.Mutex
	closed bool
	conns  map[io.Closer]struct{}
	// flows maps UDP peers to their flows; guarded by mu.
	flows map[netip.AddrPort]*exposeFlow
}

// openExposure opens the host socket of job id's exposure x, carried to
// the job's tunnel address job.
func (s *Stack) openExposure(id jobs.ID, job netip.Addr, x forward.Exposure) (*exposure, error) {
	f := x.Family()
	at := x.PublicAddr.Unmap()
	if at.IsUnspecified() {
		at = s.egress[f.Index]
	}
	if !at.IsValid() {
		return nil, fmt.Errorf("expose %s/%d of job %s: no %s egress address to listen on (set --egress-addr)", x.Proto, x.JobPort, id, f)
	}
	network := x.Proto.String() + "4" // "tcp4" or "udp6", as net wants it
	if f == ipfamily.V6 {
		network = x.Proto.String() + "6"
	}
	ap := netip.AddrPortFrom(at, x.PublicPort)
	e := &exposure{s: s, id: id, job: job, x: x, conns: make(map[io.Closer]struct{}), flows: make(map[netip.AddrPort]*exposeFlow)}
	e.listenAddr = ap.String()
	var err error
	// A job's own address is on no interface.
	lc := net.ListenConfig{Control: freebind}
	if x.Proto == ipproto.TCP {
		var ln net.Listener
		if ln, err = lc.Listen(context.Background(), network, ap.String()); err == nil {
			e.ln = ln.(*net.TCPListener)
		}
	} else {
		var pc net.PacketConn
		if pc, err = lc.ListenPacket(context.Background(), network, ap.String()); err == nil {
			e.pc = pc.(*net.UDPConn)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("expose %s/%d of job %s: listen on %s: %w", x.Proto, x.JobPort, job, e.listenAddr, err)
	}
	e.ctx, e.cancel = context.WithCancel(s.ctx)
	return e, nil
}

// start runs the exposure's accept or receive loop.
func (e *exposure) start() {
	ok := e.s.goStart(func() {
		if e.ln != nil {
			e.serveTCP()
		} else {
			e.serveUDP()
		}
	})
	if !ok {
		e.Close()
	}
}

// add registers c to be closed with e; it closes c and returns false if e
// is closed.
func (e *exposure) add(c io.Closer) bool {
	e.mu.Lock()
	closed := e.closed
	if !closed {
		e.conns[c] = struct{}{}
	}
	e.mu.Unlock()
	if closed {
		c.Close()
	}
	return !closed
}

func (e *exposure) remove(c io.Closer) {
	e.mu.Lock()
	delete(e.conns, c)
	e.mu.Unlock()
}

// Close closes the host socket and everything carried. It is idempotent.
func (e *exposure) Close() error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	conns := e.conns
	e.conns = nil
	e.mu.Unlock()
	e.cancel()
	if e.ln != nil {
		e.ln.Close()
	}
	if e.pc != nil {
		e.pc.Close()
	}
	for c := range conns {
		c.Close()
	}
	return nil
}

// target is the job's address and port in the netstack.
func (e *exposure) target() tcpip.FullAddress {
	return tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(e.job.AsSlice()), Port: e.x.JobPort}
}

// serveTCP accepts outside connections until the listener is closed.
func (e *exposure) serveTCP() {
	for {
		c, err := e.ln.AcceptTCP()
		if err != nil {
			return
		}
		if !e.s.goStart(func() { e.carryTCP(c) }) {
			c.Close()
			return
		}
	}
}

// carryTCP connects the accepted connection c to the job and relays.
func (e *exposure) carryTCP(c *net.TCPConn) {
	if !e.add(c) {
		return
	}
	ctx, cancel := context.WithTimeout(e.ctx, exposeDialTimeout)
	in, err := gonet.DialContextTCP(ctx, e.s.ns, e.target(), protoOf(e.job))
	cancel()
	e.remove(c)
	if err != nil {
		c.SetLinger(0) // the outside client sees a reset, as from a closed port
		c.Close()
		if e.s.flowDebugOn() {
			e.s.log.Debug("exposed tcp: job did not accept", "job", e.job, "port", e.x.JobPort, "from", c.RemoteAddr(), "err", err)
		}
		return
	}
	p := &connPair{a: c, b: in}
	if !e.add(p) {
		return
	}
	if e.s.flowDebugOn() {
		e.s.log.Debug("exposed tcp connection", "job", e.job, "port", e.x.JobPort, "from", c.RemoteAddr())
	}
	var fl *flows.Flow
	if peer, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		fl = e.s.openFlow(flows.ProtoTCP, peer.AddrPort(), netip.AddrPortFrom(e.job, e.x.JobPort), flows.Inbound)
		fl.SetCloser(p)
	}
	// The job's side is in: what it sends is out.
	e.s.relayTCP(in, c, nil, nil, fl)
	e.remove(p)
	p.Close()
	fl.End(e.s.endReason())
}

// exposeFlow is one outside peer's UDP flow to the job.
type exposeFlow struct {
	peer netip.AddrPort
	conn *gonet.UDPConn
	fl   *flows.Flow  // nil without a flow table
	last atomic.Int64 // unix nanoseconds of the last datagram either way
}

// serveUDP relays datagrams from outside peers to the job until the
// socket is closed.
func (e *exposure) serveUDP() {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, peer, err := e.pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		f := e.flow(peer)
		if f == nil {
			continue
		}
		f.last.Store(time.Now().UnixNano())
		if _, err := f.conn.Write(buf[:n]); err == nil {
			f.fl.AddIn(uint64(n), 1)
		}
	}
}

// flow returns peer's flow, creating it; nil if the flow cannot be made.
func (e *exposure) flow(peer netip.AddrPort) *exposeFlow {
	e.mu.Lock()
	f, ok := e.flows[peer]
	n := len(e.flows)
	e.mu.Unlock()
	if ok {
		return f
	}
	if n >= maxExposeUDPFlows {
		return nil
	}
	raddr := e.target()
	conn, err := gonet.DialUDP(e.s.ns, nil, &raddr, protoOf(e.job))
	if err != nil {
		return nil
	}
	f = &exposeFlow{peer: peer, conn: conn}
	if !e.add(conn) {
		return nil
	}
	f.fl = e.s.openFlow(flows.ProtoUDP, peer, netip.AddrPortFrom(e.job, e.x.JobPort), flows.Inbound)
	if f.fl != nil {
		f.fl.SetCloser(conn)
	}
	e.mu.Lock()
	e.flows[peer] = f
	e.mu.Unlock()
	if !e.s.goStart(func() { e.replyUDP(f) }) {
		e.dropFlow(f)
		return nil
	}
	return f
}

// replyUDP sends the job's datagrams on flow f back to its peer until f is
// idle for UDPIdleTimeout or closed.
func (e *exposure) replyUDP(f *exposeFlow) {
	defer e.dropFlow(f)
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	idle := e.s.cfg.UDPIdleTimeout
	for {
		_ = f.conn.SetReadDeadline(time.Now().Add(idle))
		n, err := f.conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && time.Since(time.Unix(0, f.last.Load())) < idle {
				continue
			}
			return
		}
		f.last.Store(time.Now().UnixNano())
		if _, err := e.pc.WriteToUDPAddrPort(buf[:n], f.peer); err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
		} else {
			f.fl.AddOut(uint64(n), 1)
		}
	}
}

// dropFlow closes f and forgets it.
func (e *exposure) dropFlow(f *exposeFlow) {
	e.mu.Lock()
	if e.flows[f.peer] == f {
		delete(e.flows, f.peer)
	}
	e.mu.Unlock()
	e.remove(f.conn)
	f.conn.Close()
	f.fl.End(e.s.idleReason())
}
