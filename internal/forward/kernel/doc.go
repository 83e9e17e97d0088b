// SPDX-License-Identifier: MIT

// Package kernel is the gateway's privileged egress backend (`airlock
// gateway --egress kernel`): jobs' packets leave the WireGuard device through
// a kernel TUN and the host's own IP stack forwards them, with nftables doing
// the per-job source NAT into the job's port block.
//
// # Theory of operation
//
// New creates a kernel TUN (default name airlock0) with wireguard-go's
// tun.CreateTUN, which negotiates virtio-net offloads (TSO/GSO, checksum) so
// that the WireGuard device can move coalesced super-packets. The TUN gets
// the gateway's tunnel address with the subnet's prefix length (the kernel
// adds the subnet route), goes up, and net.ipv4.ip_forward is switched on.
// The forwarder's Read and Write are the TUN's: a job's decrypted packet is
// written to the TUN, routed by the host like any other, and replies routed
// to the tunnel subnet come back out of Read.
//
// With an IPv6 prefix in Config.Addrs the TUN also gets the gateway's
// IPv6 tunnel address, net.ipv6.conf.all.forwarding is switched on, a
// second DNS relay listens on the IPv6 tunnel address, and jobs' IPv6
// packets go through the same table with ip6 forms of the address rules
// (one set of rules built per family from the family table,
// family_linux.go; the IPv6 floor and policy in embed_linux.go; marked
// IPv6 below).
//
// Policy and NAT live in one nftables table, "inet airlock", programmed over
// netlink (github.com/google/nftables; nothing is shelled out):
//
//	chain postrouting  nat, hook postrouting, priority srcnat (100)
//	    one group of rules per job, tagged with the job's address:
//	    ip saddr JOB oifname != TUN meta l4proto tcp snat ip to EGRESS:LO-HI
//	    ip saddr JOB oifname != TUN meta l4proto udp snat ip to EGRESS:LO-HI
//	    ip saddr JOB oifname != TUN snat ip to EGRESS   (ICMP echo and the rest)
//	    IPv6 (the job's IPv6 address in forward.Job.Addrs), tagged with
//	    the job's IPv4 address:
//	    ip6 saddr JOB6 ... snat ip6 to EGRESS6:LO-HI, as above (no
//	        EGRESS6: masquerade to LO-HI)
//	    ip6 saddr JOB6 oifname != TUN snat ip6 to OWN6  (--egress-prefix:
//	        the job's own address, one to one, ports kept)
//	chain prerouting   nat, hook prerouting, priority dstnat (-100)
//	    one rule per exposed port of a job, tagged with the job's address:
//	    iifname != TUN ip daddr EGRESS tcp|udp dport PUBPORT dnat ip to JOB:PORT
//	    IPv6: iifname != TUN ip6 daddr EGRESS6 ... dnat ip6 to [JOB6]:PORT,
//	        at an own address OWN6 the job's own port PORT
//	chain forward      filter, hook forward, priority filter (0), policy accept
//	    iif/oif TUN, TCP SYN: tcp option maxseg size set rt mtu
//	    IPv6: iifname TUN oifname TUN ip6 daddr fe80::/10 ct state new
//	        jump egress_policy                          (link-local: on-link on the TUN)
//	    iifname TUN oifname TUN goto floor              (no job-to-job)
//	    iifname TUN jump from_jobs
//	    oifname TUN ct state established,related accept
//	    oifname TUN ct status dnat accept               (exposed ports)
//	    oifname TUN drop                                (nothing unsolicited)
//	chain from_jobs    the safety floor, then accept
//	    ip saddr outside the tunnel subnet: drop
//	    without IPv6: not IPv4: drop
//	    IPv6: ip6 saddr outside the IPv6 tunnel subnet: drop;
//	        ct state ! established,related jump floor6
//	    ip daddr 0/8, 127/8, 224/4, 255.255.255.255 (the IPv4 floor of
//	        policy.Ranges): goto floor
//	    fib daddr type local, broadcast, multicast: goto refuse (host addresses)
//	    ct state ! established,related jump egress_policy   (policy_linux.go)
//	    jump job_limits
//	    ct state new add @conns { ip saddr . ip daddr . tcp/udp dport
//	        ct count over BLOCK } counter goto refuse   (block exhausted for
//	        that destination: refuse now instead of SNAT dropping it;
//	        counted in Stats, logged every 2 s by refusalLoop)
//	    IPv6: the same with @conns6, except for ip6 saddr @own6 (jobs
//	        with an own address have no block)
//	    accept
//	chain input        filter, hook input, priority filter (0), policy accept
//	    iifname TUN jump to_host
//	chain to_host      what a job may send to the gateway host itself
//	    ct state established,related accept
//	    ip daddr GW udp/tcp dport 53 accept             (DNS relay, dnsfwd)
//	    ip daddr GW icmp type echo-request accept
//	    IPv6: the same for ip6 daddr GW6 (icmpv6 echo-request)
//	    ip daddr (the IPv4 floor): goto floor           (multicast, broadcast)
//	    jump host_policy                                (explicit allows of host addresses)
//	    goto floor                                      (the tunnel addresses beyond DNS, echo)
//	chain job_limits   per job with flow limits (SetJobLimits), tagged:
//	    ip saddr JOB jump limits_JOB;  ip6 saddr JOB6 jump limits_JOB
//	chain limits_JOB   one per job with flow limits, for both families:
//	    ct state new ct count over N goto over_flows
//	    ct state new limit rate over R/second burst ⌈R⌉ packets goto over_rate
//	chain floor6       IPv6 destinations no policy opens (embed_linux.go):
//	    ::, ::1, ff00::/8, ::ffff:0:0/96, the IPv6 tunnel subnet,
//	    --egress-prefix, and the images of the IPv4 floor and tunnel
//	    subnet in NAT64, local NAT64, IPv4-compatible, 6to4 and Teredo
//	    addresses (bits under a mask): goto floor
//	chain over_flows, over_rate   counter goto refuse (read by Stats)
//	chain egress_policy, host_policy, policy_deny   the compiled egress policy
//	                   (see policy_linux.go)
//	chain floor        counter goto refuse (read by PolicyDrops as
//	                   policy.RuleFloor, like user mode's floor denials)
//	chain refuse       tcp: reject with tcp reset; else reject (icmpx port
//	                   unreachable), so that jobs fail fast, not by timeout
//	chain state        no hook; one rule whose user data remembers the
//	                   ip_forward value from before the table was made
//
// Bandwidth limits are tc HTB qdiscs on the TUN and an ifb device (a job's
// class gets a u32 filter for each of its addresses); see
// limits_linux.go.
//
// The base chains' policies are accept so that the gateway host's other
// traffic is untouched; everything entering or leaving the TUN is decided
// by the rules above. The NAT rules of a job are added by AddJob (before its
// WireGuard peer is admitted) and removed by RemoveJob by rule handle; the
// job's conntrack entries are flushed with them, so a later job at the same
// tunnel address never inherits the previous job's mappings (and ports).
//
// Exposure (`airlock run --expose`): AddJob adds a job's DNAT rules
// (expose) after its NAT, token and limit rules, RemoveJob deletes them
// (unexpose, with the conntrack entries whose reply source is the job)
// first. AddJob is all or nothing (forward.Backend): if any part fails,
// what it added so far is removed (removeJobLocked, backend_linux.go). The public port is one of the job's
// own block, so the job's SNAT may in principle pick it as a source port
// too; conntrack keeps the tuples unique, so both work.
//
// DNS: queries to the gateway's tunnel address port 53 reach the host, where
// a dnsfwd server on host sockets bound to that address relays them to the
// host's resolvers.
//
// Clean-up: Close deletes the table, restores ip_forward and closes the TUN
// (a non-persistent TUN disappears with its last file descriptor). A gateway
// killed with SIGKILL leaves the table behind; the next New finds it,
// logs it, takes the remembered ip_forward value from it and deletes it
// before creating a fresh one.
//
// Everything needs CAP_NET_ADMIN in the gateway's network namespace.
package kernel
