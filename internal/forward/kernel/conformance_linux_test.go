package kernel

import (
	"net/netip"
	"strconv"
	"testing"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/forward/forwardtest"
)

// TestConformance runs the egress backends' conformance suite against
// kernel mode, inside a fresh user and network namespace: it needs no
// root, only unprivileged user namespaces.
func TestConformance(t *testing.T) {
	if !forwardtest.Isolate(t) {
		return
	}
	forwardtest.Run(t, forwardtest.Options{
		IPBytes: true,
		New: func(t *testing.T, env forwardtest.Env) forward.Backend {
			f, err := New(Config{
				Logger:       env.Logger,
				Addr:         env.Tunnel,
				MTU:          env.MTU,
				DNSUpstreams: []netip.AddrPort{env.DNS},
				EgressAddr:   env.Egress,
				BlockSize:    env.BlockSize,
				Flows:        env.Flows,
			})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			// conntrack's UDP timeouts are the kernel's UDP idle
			// timeout; both are per network namespace.
			secs := int(env.UDPIdle.Seconds())
			for _, name := range []string{"nf_conntrack_udp_timeout", "nf_conntrack_udp_timeout_stream"} {
				if err := forwardtest.WriteSysctl("net/netfilter/"+name, strconv.Itoa(secs)); err != nil {
					f.Close()
					t.Fatal(err)
				}
			}
			return f
		},
	})
}
