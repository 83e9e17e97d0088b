// SPDX-License-Identifier: MIT

package forwardtest

import (
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"
)

// lookupA asks the DNS server at the other end of c for name's A record
// and expects want.
func lookupA(c net.Conn, name string, want netip.Addr) error {
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	dc := &dns.Conn{Conn: c}
	var err error
	for try := 0; try < 3; try++ {
		c.SetDeadline(time.Now().Add(2 * time.Second))
		if err = dc.WriteMsg(q); err != nil {
			return fmt.Errorf("dns query: %w", err)
		}
		var r *dns.Msg
		if r, err = dc.ReadMsg(); err != nil {
			continue
		}
		if r.Rcode != dns.RcodeSuccess || len(r.Answer) != 1 {
			return fmt.Errorf("dns %s: rcode %s, %d answers", name, dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		a, ok := r.Answer[0].(*dns.A)
		if !ok || a.A.String() != want.String() {
			return fmt.Errorf("dns %s: answer %v, want %s", name, r.Answer[0], want)
		}
		return nil
	}
	return fmt.Errorf("dns %s: no answer: %w", name, err)
}

// queryRcode asks the DNS server at the other end of c (UDP) for name's A
// record once and returns the answer's rcode.
func queryRcode(c net.Conn, name string) (int, error) {
	q := new(dns.Msg)
	q.SetQuestion(name, dns.TypeA)
	dc := &dns.Conn{Conn: c}
	c.SetDeadline(time.Now().Add(3 * time.Second))
	if err := dc.WriteMsg(q); err != nil {
		return 0, fmt.Errorf("dns query: %w", err)
	}
	r, err := dc.ReadMsg()
	if err != nil {
		return 0, fmt.Errorf("dns %s: no answer: %w", name, err)
	}
	return r.Rcode, nil
}
