package netstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

const (
	// dnsUpstreamTimeout bounds one exchange with one upstream.
	dnsUpstreamTimeout = 2 * time.Second
	// dnsShutdownTimeout bounds waiting for the DNS servers to stop.
	dnsShutdownTimeout = 5 * time.Second
)

// dnsServer answers DNS queries to the tunnel address, port 53, over UDP and
// TCP inside the netstack by relaying them to the upstream resolvers.
type dnsServer struct {
	s        *Stack
	udp, tcp *dns.Server
	udpc     *dns.Client
	tcpc     *dns.Client
}

// startDNS binds the tunnel address port 53 in the netstack and starts
// serving. Endpoints bound there take precedence over the forwarders.
func startDNS(s *Stack) (*dnsServer, error) {
	self := s.cfg.Addr.Addr()
	fa := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFromSlice(self.AsSlice()), Port: dnsPort}
	proto := protoOf(self)
	pc, err := gonet.DialUDP(s.ns, &fa, nil, proto)
	if err != nil {
		return nil, fmt.Errorf("dns: listen udp %s: %w", net.JoinHostPort(self.String(), "53"), err)
	}
	ln, err := gonet.ListenTCP(s.ns, fa, proto)
	if err != nil {
		pc.Close()
		return nil, fmt.Errorf("dns: listen tcp %s: %w", net.JoinHostPort(self.String(), "53"), err)
	}
	d := &dnsServer{
		s:    s,
		udpc: &dns.Client{Net: "udp", Timeout: dnsUpstreamTimeout},
		tcpc: &dns.Client{Net: "tcp", Timeout: dnsUpstreamTimeout},
	}
	d.udp = &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(d.serveUDP)}
	d.tcp = &dns.Server{Listener: ln, Handler: dns.HandlerFunc(d.serveTCP)}
	for _, srv := range []*dns.Server{d.udp, d.tcp} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		errc := make(chan error, 1)
		s.goStart(func() {
			if err := srv.ActivateAndServe(); err != nil {
				s.log.Warn("dns server stopped", "err", err)
				errc <- err
			}
		})
		select {
		case <-started:
		case err := <-errc:
			d.close()
			return nil, fmt.Errorf("dns: serve: %w", err)
		}
	}
	return d, nil
}

// close stops both servers; in-flight queries end when the Stack's context
// is cancelled.
func (d *dnsServer) close() {
	ctx, cancel := context.WithTimeout(context.Background(), dnsShutdownTimeout)
	defer cancel()
	for _, srv := range []*dns.Server{d.udp, d.tcp} {
		if err := srv.ShutdownContext(ctx); err != nil {
			// Not started (startup failed): close what it would have.
			if srv.PacketConn != nil {
				srv.PacketConn.Close()
			}
			if srv.Listener != nil {
				srv.Listener.Close()
			}
		}
	}
}

func (d *dnsServer) serveUDP(w dns.ResponseWriter, req *dns.Msg) { d.serve(w, req, d.udpc) }
func (d *dnsServer) serveTCP(w dns.ResponseWriter, req *dns.Msg) { d.serve(w, req, d.tcpc) }

// serve relays one query. UDP answers that the upstream truncated are passed
// through with TC set, so the job's resolver retries over TCP; answers
// larger than the job's UDP limit are truncated the same way.
func (d *dnsServer) serve(w dns.ResponseWriter, req *dns.Msg, c *dns.Client) {
	d.s.stats.dnsQueries.Add(1)
	resp, err := d.exchange(req, c)
	if err != nil {
		d.s.stats.dnsFailures.Add(1)
		if d.s.flowDebugOn() {
			d.s.log.Debug("dns query failed", "src", w.RemoteAddr().String(), "err", err)
		}
		resp = new(dns.Msg)
		resp.SetRcode(req, dns.RcodeServerFailure)
	}
	if c.Net == "udp" {
		size := dns.MinMsgSize
		if opt := req.IsEdns0(); opt != nil && int(opt.UDPSize()) > size {
			size = int(opt.UDPSize())
		}
		resp.Truncate(size)
	}
	w.WriteMsg(resp)
}

// exchange tries the upstreams in order and returns the first answer.
func (d *dnsServer) exchange(req *dns.Msg, c *dns.Client) (*dns.Msg, error) {
	var errs []error
	for _, up := range d.s.cfg.DNSUpstreams {
		ctx, cancel := context.WithTimeout(d.s.ctx, dnsUpstreamTimeout)
		resp, _, err := c.ExchangeContext(ctx, req, up.String())
		cancel()
		if err == nil {
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("upstream %s: %w", up, err))
		if d.s.ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, errors.New("no dns upstreams")
	}
	return nil, errors.Join(errs...)
}
