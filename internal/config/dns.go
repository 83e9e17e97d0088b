// SPDX-License-Identifier: MIT

package config

import (
	"math"

	"github.com/airlock-vpn/airlock/internal/limits"
)

// resolveDNS applies the DNS keys of j (dns_max_inflight,
// dns_queries_per_sec) on top of out. DNS through the gateway is never
// unlimited: 0 means the relay's default, "unlimited" is an error.
func (j fileJobLimits) resolveDNS(out *limits.Job, key string, bad func(string, string, ...any)) {
	if j.DNSMaxInflight != nil {
		if v := *j.DNSMaxInflight; v < 0 || v > 1<<20 {
			bad(key+".dns_max_inflight", "%d: want 0 (the default, 64) to %d", v, 1<<20)
		} else {
			out.DNSMaxInflight = int(v)
		}
	}
	if j.DNSQueriesPerSec != nil {
		var v float64
		switch x := (*j.DNSQueriesPerSec).(type) {
		case int64:
			v = float64(x)
		case float64:
			v = x
		default:
			bad(key+".dns_queries_per_sec", "%v: want a number (DNS is never unlimited; 0 is the default, 100)", x)
			return
		}
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e6 {
			bad(key+".dns_queries_per_sec", "%v: want 0 (the default, 100) or a positive number up to 1000000", v)
		} else {
			out.DNSQueriesPerSec = v
		}
	}
}
