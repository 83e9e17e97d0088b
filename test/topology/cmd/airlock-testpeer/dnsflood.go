// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// dnsFlood sends A queries for name to the first nameserver of
// /etc/resolv.conf (inside a job: the gateway) over UDP, from conc
// goroutines back to back for dur (at least one query each), and prints
// "noerror=N refused=R other=O timeout=T" (other: any other rcode).
//
//	dnsflood NAME DURATION CONC
func dnsFlood(name string, dur time.Duration, conc int) error {
	cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
	if err != nil || len(cc.Servers) == 0 {
		return fmt.Errorf("read /etc/resolv.conf: %v", err)
	}
	server := cc.Servers[0] + ":53"
	var mu sync.Mutex
	counts := map[string]int{}
	deadline := time.Now().Add(dur)
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &dns.Client{Net: "udp", Timeout: 2 * time.Second}
			for first := true; first || time.Now().Before(deadline); first = false {
				m := new(dns.Msg)
				m.SetQuestion(dns.Fqdn(name), dns.TypeA)
				r, _, err := c.Exchange(m, server)
				k := "other"
				switch {
				case err != nil:
					k = "timeout"
				case r.Rcode == dns.RcodeSuccess:
					k = "noerror"
				case r.Rcode == dns.RcodeRefused:
					k = "refused"
				}
				mu.Lock()
				counts[k]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	fmt.Printf("noerror=%d refused=%d other=%d timeout=%d\n", counts["noerror"], counts["refused"], counts["other"], counts["timeout"])
	return nil
}
