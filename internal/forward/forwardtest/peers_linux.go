// SPDX-License-Identifier: MIT

package forwardtest

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// Ports of the outside peer's servers.
const (
	echoPort   = 7    // TCP and UDP echo
	closedPort = 9    // nothing listens (TCP refused)
	dnsPort    = 53   // DNS
	sinkPort   = 9000 // a second TCP and UDP echo port
	speakPort  = 10   // TCP: sends speakLen bytes, half-closes, counts what it receives
	speakLen   = 64 << 10
)

// DNSName is the name the outside DNS server answers, with DNSAnswer.
const DNSName = "suite.example."

// DNSAnswer is DNSName's A record.
var DNSAnswer = netip.MustParseAddr("192.0.2.77")

// peers are the outside servers: a TCP echo server that also records
// each connection's remote address, a UDP echo server that records each
// datagram's source, and a DNS server.
type peers struct {
	mu      sync.Mutex
	tcpSrcs []netip.AddrPort
	udpSrcs []netip.AddrPort
	// heard are the byte counts speakPort received, per connection.
	heard []int64
	// conns are the accepted connections, closed at the end (a job that
	// left never closes its side).
	conns []net.Conn
}

// accepted records c and reports whether the peers still run.
func (p *peers) accepted(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns = append(p.conns, c)
	return true
}

// closeConns closes the accepted connections and refuses new ones.
func (p *peers) closeConns() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *peers) heardCounts() []int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]int64(nil), p.heard...)
}

func (p *peers) tcpSources() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]netip.AddrPort(nil), p.tcpSrcs...)
}

func (p *peers) udpSources() []netip.AddrPort {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]netip.AddrPort(nil), p.udpSrcs...)
}

// startPeers opens the outside servers on PeerAddr and PrivatePeerAddr,
// and the same on PeerAddr6 and PrivatePeerAddr6; they stop in t.Cleanup.
func startPeers(t *testing.T, o *Outside) *peers {
	t.Helper()
	p := &peers{conns: []net.Conn{}}
	var closers []io.Closer
	var wg sync.WaitGroup
	err := o.Do(func() error {
		var echo, speak, dnsAt []netip.AddrPort
		for _, p := range [][2]netip.Addr{{PeerAddr, PrivatePeerAddr}, {PeerAddr6, PrivatePeerAddr6}} {
			echo = append(echo, netip.AddrPortFrom(p[0], echoPort), netip.AddrPortFrom(p[0], sinkPort), netip.AddrPortFrom(p[1], echoPort))
			speak = append(speak, netip.AddrPortFrom(p[0], speakPort))
			dnsAt = append(dnsAt, netip.AddrPortFrom(p[0], dnsPort))
		}
		for _, ap := range echo {
			ln, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
			if err != nil {
				return err
			}
			closers = append(closers, ln)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.serveTCPEcho(ln, &wg)
			}()
			uc, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(ap))
			if err != nil {
				return err
			}
			closers = append(closers, uc)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.serveUDPEcho(uc)
			}()
		}
		for _, ap := range speak {
			sl, err := net.ListenTCP("tcp", net.TCPAddrFromAddrPort(ap))
			if err != nil {
				return err
			}
			closers = append(closers, sl)
			wg.Add(1)
			go func() {
				defer wg.Done()
				p.serveSpeakFirst(sl, &wg)
			}()
		}
		for _, ap := range dnsAt {
			pc, err := net.ListenPacket("udp", ap.String())
			if err != nil {
				return err
			}
			tl, err := net.Listen("tcp", ap.String())
			if err != nil {
				pc.Close()
				return err
			}
			for _, srv := range []*dns.Server{
				{PacketConn: pc, Handler: dns.HandlerFunc(serveDNS)},
				{Listener: tl, Handler: dns.HandlerFunc(serveDNS)},
			} {
				closers = append(closers, closerFunc(srv.Shutdown))
				started := make(chan struct{})
				srv.NotifyStartedFunc = func() { close(started) }
				wg.Add(1)
				go func() {
					defer wg.Done()
					srv.ActivateAndServe()
				}()
				<-started
			}
		}
		return nil
	})
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
		p.closeConns()
		wg.Wait()
	})
	if err != nil {
		t.Fatalf("outside peers: %v", err)
	}
	return p
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// serveTCPEcho echoes each connection's bytes until the client's EOF, then
// half-closes its side, so the client sees its half-close carried through.
func (p *peers) serveTCPEcho(ln *net.TCPListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.tcpSrcs = append(p.tcpSrcs, c.RemoteAddr().(*net.TCPAddr).AddrPort())
		p.mu.Unlock()
		if !p.accepted(c) {
			c.Close()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			io.Copy(c, c)
			c.CloseWrite()
			// Wait for the client to close its side too.
			io.Copy(io.Discard, c)
		}()
	}
}

// serveSpeakFirst sends speakLen bytes on each connection and half-closes
// at once, then counts the bytes it receives until the client's EOF: the
// outside's half-close carried to the job while the job still sends.
func (p *peers) serveSpeakFirst(ln *net.TCPListener, wg *sync.WaitGroup) {
	for {
		c, err := ln.AcceptTCP()
		if err != nil {
			return
		}
		if !p.accepted(c) {
			c.Close()
			return
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.Write(make([]byte, speakLen)); err != nil {
				return
			}
			c.CloseWrite()
			n, err := io.Copy(io.Discard, c)
			if err != nil {
				n = -1
			}
			p.mu.Lock()
			p.heard = append(p.heard, n)
			p.mu.Unlock()
		}()
	}
}

func (p *peers) serveUDPEcho(c *net.UDPConn) {
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		p.udpSrcs = append(p.udpSrcs, from)
		p.mu.Unlock()
		c.WriteToUDPAddrPort(buf[:n], from)
	}
}

func serveDNS(w dns.ResponseWriter, q *dns.Msg) {
	m := new(dns.Msg)
	m.SetReply(q)
	if len(q.Question) == 1 && q.Question[0].Name == DNSName && q.Question[0].Qtype == dns.TypeA {
		m.Answer = []dns.RR{&dns.A{
			Hdr: dns.RR_Header{Name: DNSName, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
			A:   DNSAnswer.AsSlice(),
		}}
	} else {
		m.Rcode = dns.RcodeNameError
	}
	w.WriteMsg(m)
}
