// SPDX-License-Identifier: MIT

package mqtun

import (
	"encoding/binary"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/checksum"
	"gvisor.dev/gvisor/pkg/tcpip/header"

	"github.com/airlock-vpn/airlock/internal/forward/forwardtest"
)

const offset = 16 // headroom for the virtio header, as wireguard-go leaves

var gw = netip.MustParseAddr("10.77.0.1")

// openTest makes a TUN of n queues in the test's own network namespace,
// up, with gw on it and 10.77.0.0/16 routed through it, and a UDP echo
// server on gw:7.
func openTest(t *testing.T, n int) *Device {
	t.Helper()
	fds, err := OpenQueues("mq0", n)
	if err != nil {
		t.Fatal(err)
	}
	d, err := FromFDs(fds)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	if d.Queues() != n {
		t.Fatalf("queues: got %d, want %d", d.Queues(), n)
	}
	link, err := netlink.LinkByName("mq0")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr("10.77.0.1/16")
	if err := netlink.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenUDP("udp4", &net.UDPAddr{IP: gw.AsSlice(), Port: 7})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFromUDP(buf)
			if err != nil {
				return
			}
			pc.WriteToUDP(buf[:n], from)
		}
	}()
	return d
}

// udp4 returns an IPv4 UDP packet from src:1000 to gw:7 with payload, at
// offset.
func udp4(src netip.Addr, payload []byte) []byte {
	b := make([]byte, offset+header.IPv4MinimumSize+header.UDPMinimumSize+len(payload))
	p := b[offset:]
	ip := header.IPv4(p)
	ip.Encode(&header.IPv4Fields{
		TotalLength: uint16(len(p)), TTL: 64, Protocol: uint8(header.UDPProtocolNumber),
		SrcAddr: tcpip.AddrFrom4(src.As4()), DstAddr: tcpip.AddrFrom4(gw.As4()),
	})
	ip.SetChecksum(^ip.CalculateChecksum())
	u := header.UDP(p[header.IPv4MinimumSize:])
	u.Encode(&header.UDPFields{SrcPort: 1000, DstPort: 7, Length: uint16(header.UDPMinimumSize + len(payload))})
	copy(u.Payload(), payload)
	xsum := header.PseudoHeaderChecksum(header.UDPProtocolNumber, ip.SourceAddress(), ip.DestinationAddress(), uint16(len(u)))
	u.SetChecksum(^checksum.Checksum(u, xsum))
	return b
}

func job(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, byte(1 + i/200), byte(2 + i%200)}) }

// TestQueues writes UDP packets of 64 jobs through a 4-queue TUN to an echo
// server and reads the answers with 4 concurrent readers from the queues
// directly: every answer comes back once, on the queue its job's packets
// were written to (Write's hash, the kernel's flow table), and the jobs
// are spread over every queue.
func TestQueues(t *testing.T) {
	if !forwardtest.Isolate(t) {
		return
	}
	const n, jobs = 4, 64
	d := openTest(t, n)
	perQueue := make([]int, n)
	for i := 0; i < jobs; i++ {
		pkt := udp4(job(i), binary.BigEndian.AppendUint32(nil, uint32(i)))
		perQueue[d.queueOf(pkt, offset)]++
		if _, err := d.Write([][]byte{pkt}, offset); err != nil {
			t.Fatalf("write job %d: %v", i, err)
		}
	}
	for q, c := range perQueue {
		if c == 0 {
			t.Errorf("queue %d: no job hashed to it (%v)", q, perQueue)
		}
	}
	type answer struct {
		queue int
		job   netip.Addr
	}
	got := make(chan answer, 4*jobs)
	var wg sync.WaitGroup
	for q := 0; q < n; q++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs, sizes := [][]byte{make([]byte, 65536)}, []int{0}
			qd := d.queues[q]
			for {
				qd.file.SetReadDeadline(time.Now().Add(2 * time.Second))
				k, err := qd.dev.Read(bufs, sizes, offset)
				if err != nil {
					return
				}
				for i := 0; i < k; i++ {
					p := header.IPv4(bufs[i][offset : offset+sizes[i]])
					if p.Protocol() == uint8(header.UDPProtocolNumber) {
						got <- answer{q, netip.AddrFrom4(p.DestinationAddress().As4())}
					}
				}
			}
		}()
	}
	wg.Wait()
	close(got)
	seen := map[netip.Addr]int{}
	for a := range got {
		seen[a.job]++
		want := d.queueOf(udp4(a.job, nil), offset)
		if a.queue != want {
			t.Errorf("answer to %s on queue %d, want %d (where its packets were written)", a.job, a.queue, want)
		}
	}
	for i := 0; i < jobs; i++ {
		if seen[job(i)] != 1 {
			t.Errorf("job %s: got %d answers, want 1", job(i), seen[job(i)])
		}
	}
}

// TestConcurrentReaders reads the Device (not its queues) with as many
// goroutines as queues, as the WireGuard device does: every answer arrives
// once, and Wake makes a waiting Read return without a packet.
func TestConcurrentReaders(t *testing.T) {
	if !forwardtest.Isolate(t) {
		return
	}
	const n, jobs = 3, 90
	d := openTest(t, n)
	got := make(chan netip.Addr, 4*jobs)
	woken := make(chan struct{}, 64)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs, sizes := [][]byte{make([]byte, 65536)}, []int{0}
			for {
				k, err := d.Read(bufs, sizes, offset)
				select {
				case <-done:
					return
				default:
				}
				if err != nil {
					woken <- struct{}{}
					continue
				}
				for i := 0; i < k; i++ {
					p := header.IPv4(bufs[i][offset : offset+sizes[i]])
					if p.Protocol() == uint8(header.UDPProtocolNumber) {
						got <- netip.AddrFrom4(p.DestinationAddress().As4())
					}
				}
			}
		}()
	}
	for i := 0; i < jobs; i++ {
		if _, err := d.Write([][]byte{udp4(job(i), []byte("x"))}, offset); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[netip.Addr]int{}
	deadline := time.After(5 * time.Second)
	for len(seen) < jobs {
		select {
		case a := <-got:
			seen[a]++
		case <-deadline:
			t.Fatalf("got answers for %d of %d jobs", len(seen), jobs)
		}
	}
	if d.busy.Load() == 0 {
		t.Errorf("no queue held while %d readers wait", n)
	}
	d.Wake()
	select {
	case <-woken:
	case <-time.After(2 * time.Second):
		t.Errorf("Wake did not make a waiting Read return")
	}
	close(done)
	// Every reader waits on a queue; closing the device ends them.
	d.Close()
	wg.Wait()
	for a, c := range seen {
		if c != 1 {
			t.Errorf("job %s: %d answers, want 1", a, c)
		}
	}
}

// TestClaim: concurrent Reads hold distinct queues; with every queue held a
// further Read shares one without marking it.
func TestClaim(t *testing.T) {
	d := &Device{queues: make([]*queue, 3)}
	var held []int
	for i := 0; i < 3; i++ {
		q, ok := d.claim()
		if !ok {
			t.Fatalf("claim %d: none free", i)
		}
		held = append(held, q)
	}
	if held[0] == held[1] || held[1] == held[2] || held[0] == held[2] {
		t.Fatalf("claimed %v, want distinct queues", held)
	}
	if q, ok := d.claim(); ok || q < 0 || q >= 3 {
		t.Fatalf("claim with all held: got %d, %v; want a queue, not held", q, ok)
	}
	d.release(held[1])
	if q, ok := d.claim(); !ok || q != held[1] {
		t.Fatalf("claim after release: got %d, %v; want %d, true", q, ok, held[1])
	}
}

func TestOpenQueuesBounds(t *testing.T) {
	for _, n := range []int{0, MaxQueues + 1} {
		if _, err := OpenQueues("mq0", n); err == nil {
			t.Errorf("OpenQueues(%d): no error", n)
		}
	}
	if _, err := FromFDs(nil); err == nil {
		t.Errorf("FromFDs(nil): no error")
	}
}
