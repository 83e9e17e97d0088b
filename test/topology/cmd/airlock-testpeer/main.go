// SPDX-License-Identifier: MIT

// Command airlock-testpeer is the peer side of the end-to-end test topology:
// small, real servers and clients that the harness in test/topology starts
// inside network namespaces (usually inet), as root or as the unprivileged
// test user.
//
// It is a separate binary, not a re-executed test binary, because test
// binaries live in go-build directories that the unprivileged test user
// cannot read.
//
// Subcommands:
//
//	http DIR ADDR            serve the files in DIR over HTTP on ADDR
//	issuer DIR ADDR          a bearer token issuer over HTTPS on ADDR: discovery and key set from DIR
//	                         (internal/bearer/bearertest.Write), read at every request; see issuer.go
//	dns ADDR ZONE.json       answer A and AAAA queries from ZONE.json ({"name.": "ip"} or {"name.": ["ip4", "ip6"]}) on ADDR (UDP and TCP)
//	udpecho ADDR             echo every UDP datagram back to its sender
//	udpclient ADDR COUNT     send COUNT numbered datagrams to ADDR one at a time,
//	                         verify each echo, print "ok COUNT" (exit 1 on failure)
//	tcpcheck ADDR            dial ADDR with a 2 s timeout; exit 0 if connected
//	tcplisten ADDR           accept TCP connections on ADDR, write "hello\n", close
//	tcpsrcport ADDR          accept TCP connections on ADDR, write the peer's "IP:PORT\n", close
//	tcpsrcclient ADDR N      open N connections to ADDR at once (a tcpsrcport server),
//	                         print each answer on a line (exit 1 on failure)
//	tcpget ADDR              dial ADDR (2 s timeout), print what it sends until EOF (2 s), exit 1 on failure
//	udpget ADDR              send "ping" to ADDR, print the first reply (3 tries of 1 s), exit 1 on none
//	tcpsink ADDR             accept TCP connections on ADDR and hold each until the client closes (60 s at most)
//	tcphold ADDR N HOLD      open N connections to ADDR one after another (5 s connect timeout each), keep
//	                         the successful ones open for HOLD (a duration), print
//	                         "ok=K failed=M slowest_failure=D"
//	impair A B CONFIG        relay frames between interfaces A and B (AF_PACKET), impaired as
//	                         the JSON impair.Config says; print "ready" once bound; exit on
//	                         SIGTERM or when the parent dies (see test/impair)
//	nouserns [-noseccomp] CMD [ARGS...]   exec CMD under a seccomp filter that makes user
//	                         namespaces (and seccomp) unavailable to it and its descendants
//	                         (see nouserns.go)
//	offloads-off IF...       turn off tx checksum offload, TSO, GSO and GRO on the interfaces
//	tcpecho, tcpflows, tcpburst   see flows.go
//	dnsflood NAME DURATION CONC   see dnsflood.go
//	rawsyn IFACE DST:PORT WAIT   see rawsyn_linux.go
//	jobs -gateway G -pin P -token T -n N [-over D] [-hold D] [-echo ADDR]   N simulated jobs in
//	                         this process (test/loadgen), JSON reports on stdout; see jobs.go
//	jobserve PORT SECONDS NAME   (inside a job) print "tcp=$AIRLOCK_EXPOSED_<PORT>" (a list, IPv4 first) and
//	                         "udp=$AIRLOCK_EXPOSED_<PORT>_UDP", then "ready"; answer "hello from NAME"
//	                         on TCP and UDP PORT of every address; exit 0 after SECONDS
//
// Servers bind their sockets before they serve, so a successful TCP connect
// to a server means all its sockets are ready. Servers run until killed.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	args := os.Args[2:]
	if ok, err := runFlowPeer(os.Args[1], args); ok {
		if err != nil {
			fmt.Fprintf(os.Stderr, "airlock-testpeer %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	switch os.Args[1] {
	case "jobs":
		err = runJobs(args)
	case "attestjoin":
		err = runAttestJoin(args)
	case "http":
		need(args, 2)
		err = serveHTTP(args[0], args[1])
	case "issuer":
		need(args, 2)
		err = serveIssuer(args[0], args[1])
	case "dns":
		need(args, 2)
		err = serveDNS(args[0], args[1])
	case "udpecho":
		need(args, 1)
		err = udpEcho(args[0])
	case "dnsflood":
		need(args, 3)
		var d time.Duration
		var n int
		if d, err = time.ParseDuration(args[1]); err == nil {
			if n, err = strconv.Atoi(args[2]); err == nil {
				err = dnsFlood(args[0], d, n)
			}
		}
	case "udpclient":
		need(args, 2)
		var n int
		n, err = strconv.Atoi(args[1])
		if err == nil {
			err = udpClient(args[0], n)
		}
	case "tcpcheck":
		need(args, 1)
		err = tcpCheck(args[0])
	case "tcplisten":
		need(args, 1)
		err = tcpListen(args[0])
	case "tcpsrcport":
		need(args, 1)
		err = tcpSrcPort(args[0])
	case "tcpsrcclient":
		need(args, 2)
		var n int
		n, err = strconv.Atoi(args[1])
		if err == nil {
			err = tcpSrcClient(args[0], n)
		}
	case "tcpget":
		need(args, 1)
		err = tcpGet(args[0])
	case "udpget":
		need(args, 1)
		err = udpGet(args[0])
	case "tcpsink":
		need(args, 1)
		err = tcpSink(args[0])
	case "tcphold":
		need(args, 3)
		var n int
		var hold time.Duration
		n, err = strconv.Atoi(args[1])
		if err == nil {
			hold, err = time.ParseDuration(args[2])
		}
		if err == nil {
			err = tcpHold(args[0], n, hold)
		}
	case "nouserns":
		err = noUserNS(args)
	case "impair":
		need(args, 3)
		err = runImpair(args[0], args[1], args[2])
	case "offloads-off":
		if len(args) == 0 {
			usage()
		}
		err = offloadsOff(args)
	case "rawsyn":
		need(args, 3)
		var wait time.Duration
		if wait, err = time.ParseDuration(args[2]); err == nil {
			err = rawSYN(args[0], args[1], wait)
		}
	case "jobserve":
		need(args, 3)
		var secs int
		secs, err = strconv.Atoi(args[1])
		if err == nil {
			err = jobServe(args[0], time.Duration(secs)*time.Second, args[2])
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "airlock-testpeer %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: airlock-testpeer http DIR ADDR | dns ADDR ZONE.json | udpecho ADDR | udpclient ADDR COUNT | tcpcheck ADDR | tcplisten ADDR | ... (see the package comment)")
	os.Exit(2)
}

func need(args []string, n int) {
	if len(args) != n {
		usage()
	}
}

func serveHTTP(dir, addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           http.FileServer(http.Dir(dir)),
		ReadHeaderTimeout: 10 * time.Second,
	}
	return srv.Serve(ln)
}

// serveDNS answers A records for the names in the zone file, NODATA for
// other types of those names, and NXDOMAIN for everything else.
func serveDNS(addr, zoneFile string) error {
	b, err := os.ReadFile(zoneFile)
	if err != nil {
		return err
	}
	// A name maps to one address ("ip") or several (["ip", "ip6"]).
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("parse zone %s: %w", zoneFile, err)
	}
	zone := make(map[string][]netip.Addr, len(raw))
	for name, v := range raw {
		var list []string
		if err := json.Unmarshal(v, &list); err != nil {
			var one string
			if err := json.Unmarshal(v, &one); err != nil {
				return fmt.Errorf("zone %s: %q: want an address or a list of them", zoneFile, name)
			}
			list = []string{one}
		}
		for _, a := range list {
			ip, err := netip.ParseAddr(a)
			if err != nil {
				return fmt.Errorf("zone %s: %q: %w", zoneFile, name, err)
			}
			zone[strings.ToLower(dns.Fqdn(name))] = append(zone[strings.ToLower(dns.Fqdn(name))], ip)
		}
	}
	handler := dns.HandlerFunc(func(w dns.ResponseWriter, req *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(req)
		m.Authoritative = true
		if len(req.Question) != 1 {
			m.Rcode = dns.RcodeFormatError
			_ = w.WriteMsg(m)
			return
		}
		q := req.Question[0]
		ips, ok := zone[strings.ToLower(q.Name)]
		if !ok {
			m.Rcode = dns.RcodeNameError
		}
		for _, ip := range ips {
			switch {
			case q.Qtype == dns.TypeA && ip.Is4():
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
					A:   ip.AsSlice(),
				})
			case q.Qtype == dns.TypeAAAA && ip.Is6():
				m.Answer = append(m.Answer, &dns.AAAA{
					Hdr:  dns.RR_Header{Name: q.Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60},
					AAAA: ip.AsSlice(),
				})
			}
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- (&dns.Server{PacketConn: pc, Handler: handler}).ActivateAndServe() }()
	go func() { errc <- (&dns.Server{Listener: ln, Handler: handler}).ActivateAndServe() }()
	return <-errc
}

func udpEcho(addr string) error {
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return err
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return err
		}
		_, _ = pc.WriteTo(buf[:n], from)
	}
}

// udpClient sends count datagrams one at a time. Each is retried up to 5
// times with a 500 ms reply timeout; the whole run is bounded by 60 s.
func udpClient(addr string, count int) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	deadline := time.Now().Add(60 * time.Second)
	buf := make([]byte, 2048)
	retries := 0
	for i := 0; i < count; i++ {
		msg := []byte(fmt.Sprintf("airlock-udp %d %s", i, strings.Repeat("x", i%512)))
		ok := false
		for attempt := 0; attempt < 5 && !ok; attempt++ {
			if time.Now().After(deadline) {
				return fmt.Errorf("deadline exceeded after %d of %d datagrams", i, count)
			}
			if attempt > 0 {
				retries++
			}
			if _, err := c.Write(msg); err != nil {
				return fmt.Errorf("send %d: %w", i, err)
			}
			wait := time.Now().Add(500 * time.Millisecond)
			_ = c.SetReadDeadline(wait)
			for {
				n, err := c.Read(buf)
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						break
					}
					// ICMP errors surface as ECONNREFUSED; count as a lost attempt.
					time.Sleep(50 * time.Millisecond)
					break
				}
				if bytes.Equal(buf[:n], msg) {
					ok = true
					break
				}
				// A late echo of an earlier datagram: ignore it.
			}
		}
		if !ok {
			return fmt.Errorf("no correct echo for datagram %d of %d after 5 attempts", i, count)
		}
	}
	fmt.Printf("ok %d\n", count)
	if retries > 0 {
		fmt.Fprintf(os.Stderr, "retries: %d\n", retries)
	}
	return nil
}

func tcpCheck(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	return c.Close()
}

func tcpListen(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Write([]byte("hello\n"))
		_ = c.Close()
	}
}

// tcpSrcPort tells every TCP client the address and port it came from, as
// the server saw them (after any NAT on the way).
func tcpSrcPort(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		_, _ = c.Write([]byte(c.RemoteAddr().String() + "\n"))
		_ = c.Close()
	}
}

// tcpSrcClient holds n connections to a tcpsrcport server open at once (so
// that they use n different source ports) and prints the answers.
func tcpSrcClient(addr string, n int) error {
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return fmt.Errorf("connection %d: %w", i+1, err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b := make([]byte, 128)
		m, err := c.Read(b)
		if err != nil {
			return fmt.Errorf("connection %d: read: %w", i+1, err)
		}
		fmt.Print(strings.TrimSpace(string(b[:m])) + "\n")
	}
	return nil
}

func tcpGet(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil {
		return fmt.Errorf("read: %w (got %q)", err, b)
	}
	fmt.Print(string(b))
	return nil
}

func udpGet(addr string) error {
	c, err := net.Dial("udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for range 3 {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		n, err := c.Read(buf)
		if err == nil {
			fmt.Print(string(buf[:n]))
			return nil
		}
	}
	return fmt.Errorf("no reply from %s", addr)
}

func tcpSink(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			_, _ = io.Copy(io.Discard, c)
		}()
	}
}

// tcpHold opens n connections one after another and keeps those that
// succeed open for hold. A failure that takes long (a hang until the
// timeout) shows in slowest_failure.
func tcpHold(addr string, n int, hold time.Duration) error {
	var conns []net.Conn
	var failed int
	var slowest time.Duration
	var lastErr error
	for range n {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			failed++
			slowest = max(slowest, time.Since(start))
			lastErr = err
			continue
		}
		conns = append(conns, c)
	}
	fmt.Printf("ok=%d failed=%d slowest_failure=%v\n", len(conns), failed, slowest.Round(time.Millisecond))
	if lastErr != nil {
		fmt.Fprintf(os.Stderr, "last failure: %v\n", lastErr)
	}
	time.Sleep(hold)
	for _, c := range conns {
		c.Close()
	}
	return nil
}

// jobServe runs inside a job with exposed ports: it reports where they are
// reachable and answers on them.
func jobServe(port string, d time.Duration, name string) error {
	p, err := strconv.Atoi(port)
	if err != nil {
		return err
	}
	msg := []byte("hello from " + name + "\n")
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", p))
	if err != nil {
		return err
	}
	pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", p))
	if err != nil {
		return err
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.SetDeadline(time.Now().Add(2 * time.Second))
			_, _ = c.Write(msg)
			_ = c.Close()
		}
	}()
	go func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo(msg, from)
		}
	}()
	fmt.Printf("tcp=%s\nudp=%s\nready\n", os.Getenv("AIRLOCK_EXPOSED_"+port), os.Getenv("AIRLOCK_EXPOSED_"+port+"_UDP"))
	time.Sleep(d)
	return nil
}
