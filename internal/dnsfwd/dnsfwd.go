// SPDX-License-Identifier: MIT

// Package dnsfwd answers jobs' DNS queries at the gateway's tunnel address
// by relaying them to the gateway host's resolvers, over UDP and TCP. It
// serves on any net.PacketConn and net.Listener, so the user-mode egress
// binds it inside its netstack and the kernel mode on a host socket.
//
// Every query is admitted against its job's limits (limits.go: concurrent
// queries and queries per second, per job, whichever of the job's
// addresses a query comes from; excess answered REFUSED) and reported to the flow table (Config.Flows), which counts it
// and logs it like a flow, rate-limited per job.
package dnsfwd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/miekg/dns"

	"github.com/airlock-vpn/airlock/internal/flows"
)

const (
	// UpstreamTimeout bounds one exchange with one upstream.
	UpstreamTimeout = 2 * time.Second
	// shutdownTimeout bounds waiting for the servers to stop.
	shutdownTimeout = 5 * time.Second
)

// Config configures a Server.
type Config struct {
	Logger *slog.Logger
	// Upstreams are tried in order for every query.
	Upstreams []netip.AddrPort
	// Route, if set, may take a query from the upstreams: it returns the
	// answer to relay and true, or false to leave the query to them.
	// network is "udp" or "tcp", how the job asked.
	Route func(ctx context.Context, req *dns.Msg, network string) (resp *dns.Msg, ok bool, err error)
	// Observe, if set, is called after every query with whether it
	// failed (answered SERVFAIL). It must not block.
	Observe func(failed bool)
	// Debug, if set, reports whether a per-query debug line may be
	// logged now (callers rate-limit).
	Debug func() bool
	// Flows, if set, gets every query (flows.Table.DNS).
	Flows *flows.Table
	// Limiter holds the jobs' limits. The relays on each of a gateway's
	// tunnel addresses share one, so a job's budget is one whatever the
	// family it asks over; nil: the Server makes its own.
	Limiter *Limiter
}

// Server relays queries to the upstreams. It is safe for concurrent use.
type Server struct {
	cfg      Config
	ctx      context.Context
	cancel   context.CancelFunc
	udp, tcp *dns.Server
	udpc     *dns.Client
	tcpc     *dns.Client
	done     chan struct{}
	lim      *Limiter
}

// Limiter returns the limits s admits queries against (Config.Limiter).
func (s *Server) Limiter() *Limiter { return s.lim }

// Start serves DNS on pc (UDP) and ln (TCP), either of which may be nil,
// and returns once both are serving. The Server owns pc and ln.
func Start(cfg Config, pc net.PacketConn, ln net.Listener) (*Server, error) {
	if cfg.Logger == nil {
		return nil, errors.New("dnsfwd: no logger")
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:    cfg,
		ctx:    ctx,
		cancel: cancel,
		udpc:   &dns.Client{Net: "udp", Timeout: UpstreamTimeout},
		tcpc:   &dns.Client{Net: "tcp", Timeout: UpstreamTimeout},
		done:   make(chan struct{}),
		lim:    cfg.Limiter,
	}
	if s.lim == nil {
		s.lim = new(Limiter)
	}
	var servers []*dns.Server
	if pc != nil {
		s.udp = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(s.serveUDP), MsgAcceptFunc: acceptQuery}
		servers = append(servers, s.udp)
	}
	if ln != nil {
		ln = &limitedListener{Listener: ln, s: s}
		s.tcp = &dns.Server{Listener: ln, Handler: dns.HandlerFunc(s.serveTCP), MsgAcceptFunc: acceptQuery}
		servers = append(servers, s.tcp)
	}
	running := make(chan struct{}, len(servers))
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		go func() {
			defer func() { running <- struct{}{} }()
			if err := srv.ActivateAndServe(); err != nil {
				errc <- err
			}
		}()
		select {
		case <-started:
		case err := <-errc:
			s.Close()
			return nil, fmt.Errorf("dns: serve: %w", err)
		}
	}
	go func() {
		for range servers {
			<-running
		}
		close(s.done)
	}()
	return s, nil
}

// limitedListener accepts a job's TCP connections while it holds fewer
// than its max in-flight queries' worth (limiter.openConn) and closes the
// rest at once, counted and logged as refused queries: unbounded, every
// connection would hold a goroutine of the relay until its idle timeout.
type limitedListener struct {
	net.Listener
	s *Server
}

func (l *limitedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := addrPortOf(c.RemoteAddr())
		now := time.Now()
		if l.s.lim.openConn(src.Addr(), now) {
			return &limitedConn{Conn: c, release: func() { l.s.lim.closeConn(src.Addr()) }}, nil
		}
		c.Close()
		if l.s.cfg.Flows != nil {
			l.s.cfg.Flows.DNS(flows.DNSQuery{Proto: flows.ProtoTCP, Src: src, Dst: addrPortOf(c.LocalAddr()),
				Verdict: flows.DNSInflight, Start: now, End: now})
		}
	}
}

// limitedConn releases its slot once, when closed.
type limitedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// Close stops serving, ends in-flight upstream exchanges and waits for the
// servers to return.
func (s *Server) Close() {
	s.cancel()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for _, srv := range []*dns.Server{s.udp, s.tcp} {
		if srv == nil {
			continue
		}
		if err := srv.ShutdownContext(ctx); err != nil {
			// Not started: close what it would have.
			if srv.PacketConn != nil {
				srv.PacketConn.Close()
			}
			if srv.Listener != nil {
				srv.Listener.Close()
			}
		}
	}
	select {
	case <-s.done:
	case <-ctx.Done():
	}
}

// acceptQuery admits standard queries only (opcode QUERY, one question,
// no answer or authority records, at most OPT and one more additional
// record) and answers everything else itself: responses are ignored,
// other opcodes (NOTIFY, UPDATE, IQUERY, STATUS, ...) get NOTIMP, malformed
// queries FORMERR. The relay sends the site's resolvers what a stub
// resolver sends, from the gateway's address, and nothing else; the DNS
// library's default would pass NOTIFY through. Meta query types are
// refused in serve (standardType).
func acceptQuery(dh dns.Header) dns.MsgAcceptAction {
	const qr = 1 << 15
	if dh.Bits&qr != 0 {
		return dns.MsgIgnore
	}
	if opcode := int(dh.Bits>>11) & 0xF; opcode != dns.OpcodeQuery {
		return dns.MsgRejectNotImplemented
	}
	if dh.Qdcount != 1 || dh.Ancount != 0 || dh.Nscount != 0 || dh.Arcount > 2 {
		return dns.MsgReject
	}
	return dns.MsgAccept
}

// standardType reports whether a query of type t is one the relay passes
// on: not a zone transfer (AXFR, IXFR), nor a transaction key, signature
// or other meta type (TKEY, TSIG, OPT, MAILA, MAILB); ANY is a query like
// another.
func standardType(t uint16) bool {
	switch t {
	case dns.TypeAXFR, dns.TypeIXFR, dns.TypeTKEY, dns.TypeTSIG, dns.TypeOPT, dns.TypeMAILA, dns.TypeMAILB:
		return false
	}
	return true
}

func (s *Server) serveUDP(w dns.ResponseWriter, req *dns.Msg) { s.serve(w, req, s.udpc) }
func (s *Server) serveTCP(w dns.ResponseWriter, req *dns.Msg) { s.serve(w, req, s.tcpc) }

// serve relays one query, if the job's limits admit it (else it answers
// REFUSED). UDP answers that the upstream truncated are passed through
// with TC set, so the job's resolver retries over TCP; answers larger than
// the job's UDP limit are truncated the same way.
func (s *Server) serve(w dns.ResponseWriter, req *dns.Msg, c *dns.Client) {
	start := time.Now()
	src := addrPortOf(w.RemoteAddr())
	verdict := flows.Allowed
	var resp *dns.Msg
	if len(req.Question) != 1 || !standardType(req.Question[0].Qtype) {
		verdict = flows.DNSNotQuery
	} else {
		switch s.lim.admit(src.Addr(), start) {
		case overRate:
			verdict = flows.DNSRate
		case overInflight:
			verdict = flows.DNSInflight
		}
	}
	if verdict != flows.Allowed {
		resp = new(dns.Msg)
		resp.SetRcode(req, dns.RcodeRefused)
	} else {
		var err error
		resp, err = s.exchange(req, c)
		s.lim.done(src.Addr())
		if s.cfg.Observe != nil {
			s.cfg.Observe(err != nil)
		}
		if err != nil {
			if s.cfg.Debug != nil && s.cfg.Debug() {
				s.cfg.Logger.Debug("dns query failed", "src", src.String(), "err", err)
			}
			resp = new(dns.Msg)
			resp.SetRcode(req, dns.RcodeServerFailure)
		}
	}
	if c.Net == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
			size = int(opt.UDPSize())
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
	s.record(w, c, src, req, resp, verdict, start)
}

// record reports the query to the flow table.
func (s *Server) record(w dns.ResponseWriter, c *dns.Client, src netip.AddrPort, req, resp *dns.Msg, verdict string, start time.Time) {
	if s.cfg.Flows == nil {
		return
	}
	q := flows.DNSQuery{Proto: flows.ProtoUDP, Src: src, Dst: addrPortOf(w.LocalAddr()), Verdict: verdict,
		Start: start, End: time.Now()}
	if c.Net == "tcp" {
		q.Proto = flows.ProtoTCP
	}
	if len(req.Question) > 0 {
		q.Info.Name = req.Question[0].Name
		q.Info.Type = dns.Type(req.Question[0].Qtype).String()
	}
	q.Info.Rcode = dns.RcodeToString[resp.Rcode]
	q.Info.Answers = len(resp.Answer)
	s.cfg.Flows.DNS(q)
}

// addrPortOf returns a's address and port (the zero AddrPort if a is
// neither UDP nor TCP).
func addrPortOf(a net.Addr) netip.AddrPort {
	switch a := a.(type) {
	case *net.UDPAddr:
		return unmapped(a.AddrPort())
	case *net.TCPAddr:
		return unmapped(a.AddrPort())
	}
	if a == nil {
		return netip.AddrPort{}
	}
	ap, _ := netip.ParseAddrPort(a.String())
	return ap
}

// unmapped returns ap with an IPv4-mapped address as IPv4.
func unmapped(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// exchange asks Route, then tries the upstreams in order and returns the
// first answer.
func (s *Server) exchange(req *dns.Msg, c *dns.Client) (*dns.Msg, error) {
	if s.cfg.Route != nil {
		ctx, cancel := context.WithTimeout(s.ctx, UpstreamTimeout)
		resp, ok, err := s.cfg.Route(ctx, req, c.Net)
		cancel()
		if ok {
			return resp, err
		}
	}
	var errs []error
	for _, up := range s.cfg.Upstreams {
		ctx, cancel := context.WithTimeout(s.ctx, UpstreamTimeout)
		resp, _, err := c.ExchangeContext(ctx, req, up.String())
		cancel()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
		if s.ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no dns upstreams")
	}
	return nil, errors.Join(errs...)
}

// ReadResolvConf returns the nameservers of a resolv.conf file, with its
// port (53 unless the file says otherwise). Zoned or otherwise odd entries
// are skipped, as libc skips ones it cannot use.
func ReadResolvConf(path string) ([]netip.AddrPort, error) {
	cc, err := dns.ClientConfigFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("read dns upstreams from %s: %w", path, err)
	}
	port := uint16(53)
	if p, err := strconv.ParseUint(cc.Port, 10, 16); err == nil && p != 0 {
		port = uint16(p)
	}
	var ups []netip.AddrPort
	for _, s := range cc.Servers {
		a, err := netip.ParseAddr(s)
		if err != nil {
			continue
		}
		ups = append(ups, netip.AddrPortFrom(a.Unmap(), port))
	}
	if len(ups) == 0 {
		return nil, fmt.Errorf("read dns upstreams from %s: no usable nameserver; set --dns-upstream", path)
	}
	return ups, nil
}
