// SPDX-License-Identifier: MIT

// Package capture copies the jobs' decrypted packets, as the gateway's
// WireGuard device reads and writes them, into pcap streams for the site's
// intrusion detection (Zeek, Suricata, tcpdump) and for an admin's live
// capture of one job (`airlock capture`).
//
// # Theory of operation
//
// Both egress modes hand the WireGuard device one tun.Device: user mode the
// netstack, kernel mode the kernel TUN. [Device] wraps it, like Tailscale's
// tstun wrapper: Write sees every packet a job sent (after decryption,
// before the backend), Read every packet on its way to a job (before
// encryption). Packets there carry the job's own tunnel address, so the
// capture names jobs as `airlock status` and `airlock whois` do.
//
// A capture is a [Tap]: a selection (jobs by token or batch job id, or one
// job's address), a [Filter] (a small subset of pcap-filter: protocol,
// host, net, port), an optional destination-rule match, and a bounded
// byte ring of pcap records. The data path's only work for a tap is to
// match the packet and copy a record into the ring under the ring's lock,
// once per batch; when the ring is full the packet is dropped and counted,
// so a slow or stalled reader never slows jobs. With no tap attached the
// data path is one atomic load per batch and allocates nothing.
//
// A goroutine per tap ([Tap.Serve]) moves the ring's bytes to the sink: a
// file, a named pipe (captured only while a reader has it open; a new
// reader gets a new stream), a TAP device (one Ethernet frame per packet),
// or an admin's HTTP response over the admin socket.
package capture
