// SPDX-License-Identifier: MIT

package capture

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/test/topology"
)

// nopTUN is a tun.Device whose Write swallows packets and whose Read
// returns the packets of in, one batch per call.
type nopTUN struct {
	tun.Device
	in [][]byte
}

func (n *nopTUN) Write(bufs [][]byte, offset int) (int, error) { return len(bufs), nil }
func (n *nopTUN) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	k := 0
	for ; k < len(n.in) && k < len(bufs); k++ {
		sizes[k] = copy(bufs[k][offset:], n.in[k])
	}
	return k, nil
}

// ipv4 builds an IPv4 packet of proto from src:sport to dst:dport with
// payload bytes of payload.
func ipv4(src, dst string, proto uint8, sport, dport uint16, payload int) []byte {
	l4 := 8
	if proto == protoTCP {
		l4 = 20
	}
	b := make([]byte, 20+l4+payload)
	b[0] = 0x45
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	b[8] = 64
	b[9] = proto
	s, d := netip.MustParseAddr(src).As4(), netip.MustParseAddr(dst).As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[20:], sport)
	binary.BigEndian.PutUint16(b[22:], dport)
	return b
}

// record is one pcap record read back.
type record struct {
	capLen, origLen int
	data            []byte
}

// readPcap parses a pcap stream: global header, then records.
func readPcap(t *testing.T, b []byte) (link uint32, snaplen int, recs []record) {
	t.Helper()
	if len(b) < globalHeaderLen {
		t.Fatalf("pcap stream of %d bytes: no global header", len(b))
	}
	if m := binary.LittleEndian.Uint32(b); m != 0xa1b2c3d4 {
		t.Fatalf("magic: got %#x, want 0xa1b2c3d4", m)
	}
	if v := [2]uint16{binary.LittleEndian.Uint16(b[4:]), binary.LittleEndian.Uint16(b[6:])}; v != [2]uint16{2, 4} {
		t.Fatalf("version: got %v, want 2.4", v)
	}
	snaplen = int(binary.LittleEndian.Uint32(b[16:]))
	link = binary.LittleEndian.Uint32(b[20:])
	b = b[globalHeaderLen:]
	for len(b) > 0 {
		if len(b) < recordHeaderLen {
			t.Fatalf("truncated record header: %d bytes", len(b))
		}
		r := record{capLen: int(binary.LittleEndian.Uint32(b[8:])), origLen: int(binary.LittleEndian.Uint32(b[12:]))}
		if len(b) < recordHeaderLen+r.capLen {
			t.Fatalf("truncated record: %d of %d bytes", len(b)-recordHeaderLen, r.capLen)
		}
		r.data = b[recordHeaderLen : recordHeaderLen+r.capLen]
		recs = append(recs, r)
		b = b[recordHeaderLen+r.capLen:]
	}
	return link, snaplen, recs
}

func TestFilter(t *testing.T) {
	job, web, dns := "100.64.0.2", "192.0.2.10", "100.64.0.1"
	httpOut := ipv4(job, web, protoTCP, 40000, 80, 10)
	httpIn := ipv4(web, job, protoTCP, 80, 40000, 10)
	dnsOut := ipv4(job, dns, protoUDP, 5353, 53, 10)
	ping := ipv4(job, web, protoICMP, 0, 0, 10)
	tests := []struct {
		expr string
		pkt  []byte
		out  bool
		want bool
	}{
		{"", httpOut, true, true},
		{"tcp", httpOut, true, true},
		{"udp", httpOut, true, false},
		{"icmp", ping, true, true},
		{"port 80", httpIn, false, true},
		{"dst port 80", httpIn, false, false},
		{"src port 80", httpIn, false, true},
		{"tcp port 80", httpOut, true, true},
		{"udp port 80", httpOut, true, false},
		{"port 80", ping, true, false},
		{"host 192.0.2.10", httpIn, false, true},
		{"src host 100.64.0.2", httpIn, false, false},
		{"net 192.0.2.0/24 and not port 22", httpOut, true, true},
		{"udp dst port 53 or icmp", dnsOut, true, true},
		{"not (udp or icmp)", dnsOut, true, false},
		{"! udp && ! icmp", httpOut, true, true},
		{"portrange 50-60", dnsOut, true, true},
		{"tcp or udp and port 53", httpOut, true, true}, // and binds tighter
		{"ip", httpOut, true, true},
		{"ip6", httpOut, true, false},
		{"TCP PORT 80", httpOut, true, true},
	}
	for _, tt := range tests {
		f, err := ParseFilter(tt.expr)
		if err != nil {
			t.Fatalf("ParseFilter(%q): %v", tt.expr, err)
		}
		if got := f.Match(tt.pkt, tt.out); got != tt.want {
			t.Errorf("%q on packet %d: got %v, want %v", tt.expr, tt.pkt[9], got, tt.want)
		}
	}
	for _, bad := range []string{"host", "host example.org", "port http", "tcp and", "(tcp", "greater 100", "src dst host 1.2.3.4", "portrange 9-1", "tcp;rm", "ether host 1"} {
		if _, err := ParseFilter(bad); err == nil {
			t.Errorf("ParseFilter(%q): got nil error, want one", bad)
		}
	}
}

func TestFilterRules(t *testing.T) {
	rules := []policy.Rule{{Name: "web", To: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 80, Hi: 80}}}}
	f, _ := ParseFilter("")
	f = f.WithRules(rules)
	for _, tt := range []struct {
		pkt  []byte
		out  bool
		want bool
	}{
		{ipv4("100.64.0.2", "192.0.2.10", protoTCP, 40000, 80, 0), true, true},
		{ipv4("192.0.2.10", "100.64.0.2", protoTCP, 80, 40000, 0), false, true}, // the reply: remote is the source
		{ipv4("100.64.0.2", "192.0.2.10", protoTCP, 40000, 443, 0), true, false},
		{ipv4("100.64.0.2", "198.51.100.1", protoTCP, 40000, 80, 0), true, false},
		{ipv4("100.64.0.2", "192.0.2.10", protoUDP, 40000, 80, 0), true, false},
	} {
		if got := f.Match(tt.pkt, tt.out); got != tt.want {
			t.Errorf("packet %x: got %v, want %v", tt.pkt[12:24], got, tt.want)
		}
	}
}

func TestRingBounded(t *testing.T) {
	q := newRing(100)
	put := func(n int) bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return q.putLocked(bytes.Repeat([]byte{byte(n)}, n))
	}
	if !put(60) || put(41) || !put(40) || put(1) {
		t.Fatal("ring: want 60 and 40 bytes to fit in 100 and 41 or 1 more not")
	}
	if a, b := q.peek(); len(a) != 100 || len(b) != 0 {
		t.Fatalf("peek: got %d+%d bytes, want 100+0", len(a), len(b))
	}
	q.release(70)
	if !put(50) { // wraps around
		t.Fatal("ring: want 50 bytes to fit after releasing 70")
	}
	a, b := q.peek()
	got := append(append([]byte(nil), a...), b...)
	want := append(bytes.Repeat([]byte{40}, 30), bytes.Repeat([]byte{50}, 50)...)
	if !bytes.Equal(got, want) || len(b) != 50 {
		t.Fatalf("peek after wrap: got %v (second part %d bytes), want %v split 30+50", got, len(b), want)
	}
}

// TestTapStream captures both directions through a Device and reads the
// pcap stream back: records whole, job addresses kept, snaplen applied,
// selection by job, drops counted when the ring is full.
func TestTapStream(t *testing.T) {
	job, other, web := "100.64.0.2", "100.64.0.3", "192.0.2.10"
	reply := ipv4(web, job, protoTCP, 80, 40000, 100)
	var index jobs.Index
	dev := NewDevice(&nopTUN{in: [][]byte{reply, ipv4(web, other, protoTCP, 80, 40001, 100)}}, &index)
	addJob(t, dev, &index, "L1", jobs.Ref{JobID: "4242", Token: "cms"}, job)
	addJob(t, dev, &index, "L2", jobs.Ref{JobID: "4243", Token: "atlas"}, other)
	tap := dev.NewTap(TapConfig{Name: "t", Tokens: []string{"cms"}, Snaplen: 60, Buffer: 1 << 20})
	dev.Attach(tap)

	req := ipv4(job, web, protoTCP, 40000, 80, 100)
	if _, err := dev.Write([][]byte{append(make([]byte, 16), req...), append(make([]byte, 16), ipv4(other, web, protoTCP, 40001, 80, 100)...)}, 16); err != nil {
		t.Fatal(err)
	}
	bufs := [][]byte{make([]byte, 2048), make([]byte, 2048)}
	sizes := make([]int, 2)
	if _, err := dev.Read(bufs, sizes, 0); err != nil {
		t.Fatal(err)
	}
	dev.Detach(tap)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := tap.Serve(ctx, &out, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Serve: got %v, want the context's deadline", err)
	}
	link, snaplen, recs := readPcap(t, out.Bytes())
	if link != LinkRaw || snaplen != 60 {
		t.Errorf("header: got link %d snaplen %d, want %d and 60", link, snaplen, LinkRaw)
	}
	if len(recs) != 2 {
		t.Fatalf("records: got %d, want 2 (the cms job's request and reply)", len(recs))
	}
	for i, want := range [][]byte{req, reply} {
		r := recs[i]
		if r.capLen != 60 || r.origLen != len(want) || !bytes.Equal(r.data, want[:60]) {
			t.Errorf("record %d: got caplen %d origlen %d, want 60 and %d with the packet's first 60 bytes", i, r.capLen, r.origLen, len(want))
		}
	}
	if c := tap.Counters(); c.Packets.Load() != 2 || c.Drops.Load() != 0 {
		t.Errorf("counters: got %d packets %d drops, want 2 and 0", c.Packets.Load(), c.Drops.Load())
	}

	// A ring with room for one record drops the rest and counts them.
	small := dev.NewTap(TapConfig{Name: "small", Buffer: recordHeaderLen + len(req)})
	dev.Attach(small)
	dev.Write([][]byte{req, req, req}, 0)
	dev.Detach(small)
	if c := small.Counters(); c.Packets.Load() != 1 || c.Drops.Load() != 2 {
		t.Errorf("full ring: got %d packets %d drops, want 1 and 2", c.Packets.Load(), c.Drops.Load())
	}
}

// TestEndWithJobs: a live capture of one job ends when the job leaves.
func TestEndWithJobs(t *testing.T) {
	var index jobs.Index
	dev := NewDevice(&nopTUN{}, &index)
	addJob(t, dev, &index, "L1", jobs.Ref{}, "100.64.0.2")
	tap := dev.NewTap(TapConfig{Name: "live", Jobs: []string{"L1"}, EndWithJobs: true})
	dev.Attach(tap)
	dev.Write([][]byte{ipv4("100.64.0.2", "192.0.2.1", protoUDP, 1, 2, 3)}, 0)
	dev.RemoveJob("L1")
	index.Remove("L1")
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tap.Serve(ctx, &out, nil); err != nil {
		t.Fatalf("Serve after the job left: got %v, want nil", err)
	}
	if _, _, recs := readPcap(t, out.Bytes()); len(recs) != 1 {
		t.Errorf("records: got %d, want the 1 queued before the job left", len(recs))
	}
}

// TestAllocs: the data path allocates nothing, with and without a tap.
func TestAllocs(t *testing.T) {
	pkt := ipv4("100.64.0.2", "192.0.2.10", protoTCP, 40000, 80, 1380)
	bufs := make([][]byte, 32)
	for i := range bufs {
		bufs[i] = pkt
	}
	dev := NewDevice(&nopTUN{in: bufs}, nil)
	sizes := make([]int, len(bufs))
	rbufs := make([][]byte, len(bufs))
	for i := range rbufs {
		rbufs[i] = make([]byte, 2048)
	}
	run := func() {
		dev.Write(bufs, 0)
		dev.Read(rbufs, sizes, 0)
	}
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("no capture: got %v allocations per batch, want 0", n)
	}
	f, _ := ParseFilter("tcp port 80 and not host 10.0.0.1")
	tap := dev.NewTap(TapConfig{Name: "a", Filter: f, Buffer: 256 << 10})
	dev.Attach(tap)
	defer dev.Detach(tap)
	drain := func() { a, b := tap.ring.peek(); tap.ring.release(len(a) + len(b)) }
	if n := testing.AllocsPerRun(100, func() { run(); drain() }); n != 0 {
		t.Errorf("with a capture: got %v allocations per batch, want 0", n)
	}
}

// TestFeedFIFO runs a feed into a named pipe: nothing is captured before a
// reader opens it, a reader gets a whole stream, a stalled reader makes
// the feed drop (not block), and a new reader gets a new stream.
func TestFeedFIFO(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "ids.pcap")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	dev := NewDevice(&nopTUN{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		RunFeed(ctx, testLogger(t), dev, FeedConfig{TapConfig: TapConfig{Name: "ids", Buffer: 64 << 10}, To: fifo})
	}()
	defer func() { cancel(); wg.Wait() }()
	pkt := ipv4("100.64.0.2", "192.0.2.10", protoTCP, 40000, 80, 1000)
	dev.Write([][]byte{pkt}, 0) // no reader yet: not captured
	r, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return dev.taps.Load() != nil }, "the feed to attach once the pipe has a reader")
	dev.Write([][]byte{pkt, pkt}, 0)
	hdr := make([]byte, globalHeaderLen+2*(recordHeaderLen+len(pkt)))
	if _, err := io.ReadFull(r, hdr); err != nil {
		t.Fatal(err)
	}
	if _, _, recs := readPcap(t, hdr); len(recs) != 2 {
		t.Fatalf("records: got %d, want 2", len(recs))
	}
	// Stall: keep the pipe open, read nothing. Writes must not block.
	c := dev.counters["ids"]
	start := time.Now()
	for range 1000 {
		dev.Write([][]byte{pkt}, 0)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("1000 writes with a stalled reader took %v", d)
	}
	if c.Drops.Load() == 0 {
		t.Errorf("drops with a stalled reader: got 0, want > 0 (%d queued)", c.Packets.Load())
	}
	r.Close()
	// The next write finds no reader (EPIPE); a new reader gets a new
	// stream, starting with a global header.
	waitFor(t, func() bool { dev.Write([][]byte{pkt}, 0); return dev.taps.Load() == nil }, "the feed to detach after its reader left")
	r2, err := os.Open(fifo)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	waitFor(t, func() bool { return dev.taps.Load() != nil }, "the feed to attach to the new reader")
	dev.Write([][]byte{pkt}, 0)
	b := make([]byte, globalHeaderLen+recordHeaderLen+len(pkt))
	if _, err := io.ReadFull(r2, b); err != nil {
		t.Fatal(err)
	}
	readPcap(t, b)
}

// TestFeedFileMode: a feed's new file is 0600.
func TestFeedFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "feed.pcap")
	dev := NewDevice(&nopTUN{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunFeed(ctx, testLogger(t), dev, FeedConfig{TapConfig: TapConfig{Name: "f"}, To: path})
	}()
	waitFor(t, func() bool { return dev.taps.Load() != nil }, "the feed to attach")
	dev.Write([][]byte{ipv4("100.64.0.2", "192.0.2.10", protoUDP, 1, 2, 10)}, 0)
	waitFor(t, func() bool { fi, err := os.Stat(path); return err == nil && fi.Size() > globalHeaderLen }, "the record in the file")
	cancel()
	<-done
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		t.Errorf("mode: got %v, want 0600", m)
	}
	if err := ValidateTo("relative.pcap"); err == nil {
		t.Error("ValidateTo(relative path): got nil, want an error")
	}
}

// TestTAPWriter splits a pcap stream, written in odd pieces, into frames.
func TestTAPWriter(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "frames")
	f, err := os.Create(fifo)
	if err != nil {
		t.Fatal(err)
	}
	w := &tapWriter{f: f, skip: globalHeaderLen}
	var stream bytes.Buffer
	stream.Write(GlobalHeader(DefaultSnaplen, LinkEthernet))
	var want [][]byte
	for i := range 3 {
		frame := bytes.Repeat([]byte{byte(i + 1)}, 20+i)
		var h [recordHeaderLen]byte
		putRecordHeader(h[:], time.Now(), len(frame), len(frame))
		stream.Write(h[:])
		stream.Write(frame)
		want = append(want, frame)
	}
	b := stream.Bytes()
	for len(b) > 0 {
		k := min(7, len(b))
		if _, err := w.Write(b[:k]); err != nil {
			t.Fatal(err)
		}
		b = b[k:]
	}
	f.Close()
	got, _ := os.ReadFile(fifo)
	if !bytes.Equal(got, bytes.Join(want, nil)) {
		t.Errorf("frames: got %x, want %x", got, bytes.Join(want, nil))
	}
}

func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	if !topology.Poll(5*time.Second, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestSnaplenEthernet: an Ethernet capture's snaplen counts the IP
// packet; the header comes on top.
func TestSnaplenEthernet(t *testing.T) {
	dev := NewDevice(&nopTUN{}, nil)
	tap := dev.NewTap(TapConfig{Name: "eth", Snaplen: 4, Link: LinkEthernet})
	dev.Attach(tap)
	pkt := ipv4("100.64.0.2", "192.0.2.1", protoUDP, 1, 2, 3)
	dev.Write([][]byte{pkt}, 0)
	dev.Detach(tap)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	tap.Serve(ctx, &out, nil)
	link, snaplen, recs := readPcap(t, out.Bytes())
	if link != LinkEthernet || snaplen != ethHeaderLen+4 {
		t.Errorf("header: link %d snaplen %d, want %d and %d", link, snaplen, LinkEthernet, ethHeaderLen+4)
	}
	if len(recs) != 1 || recs[0].capLen != ethHeaderLen+4 || recs[0].origLen != ethHeaderLen+len(pkt) ||
		!bytes.Equal(recs[0].data[ethHeaderLen:], pkt[:4]) || binary.BigEndian.Uint16(recs[0].data[12:]) != 0x0800 {
		t.Fatalf("records: got %+v, want one Ethernet frame (IPv4) with the packet's first 4 bytes", recs)
	}
}

// TestEndWithJobsGone: a live capture of a job that left before it was
// attached ends at once.
func TestEndWithJobsGone(t *testing.T) {
	dev := NewDevice(&nopTUN{}, nil)
	tap := dev.NewTap(TapConfig{Name: "live", Jobs: []string{"gone"}, EndWithJobs: true})
	dev.Attach(tap)
	select {
	case <-tap.Done():
	case <-time.After(time.Second):
		t.Fatal("Done not closed for a capture whose job is gone")
	}
}

// addJob indexes addrs as job id's and tells dev about the job.
func addJob(t *testing.T, dev *Device, index *jobs.Index, id jobs.ID, ref jobs.Ref, addrs ...string) {
	t.Helper()
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	if err := index.Add(id, as...); err != nil {
		t.Fatal(err)
	}
	dev.AddJob(id, ref)
}
