// SPDX-License-Identifier: MIT

package device

import (
	"bytes"
	"encoding/binary"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"
)

const (
	ms       = int64(time.Millisecond)
	target   = int64(DefaultCoDelTarget)
	interval = int64(DefaultCoDelPeriod)
)

// TestCoDelNoDropBelowTarget: a queue whose packets wait less than the
// target is never dropped from, however long it stays non-empty.
func TestCoDelNoDropBelowTarget(t *testing.T) {
	var c codel
	for now := int64(0); now < 10_000*ms; now += ms / 4 {
		if c.shouldDrop(now, target-1, 100, target, interval) {
			t.Fatalf("dropped at %d ms with sojourn just below target", now/ms)
		}
	}
	// Above target but with nothing behind the packet: no drop either
	// (RFC 8289: a queue of at most one packet is not a standing queue).
	for now := int64(0); now < 1_000*ms; now += ms {
		if c.shouldDrop(now, 50*ms, 0, target, interval) {
			t.Fatalf("dropped the last packet at %d ms", now/ms)
		}
	}
}

// TestCoDelSojournDrop: a standing queue above target is first dropped
// from an interval after it went above, then at interval/sqrt(count);
// once the sojourn falls below target, dropping stops.
func TestCoDelSojournDrop(t *testing.T) {
	var c codel
	var drops []int64
	const step = ms / 10
	for now := int64(0); now <= 300*ms; now += step {
		if c.shouldDrop(now, 20*ms, 100, target, interval) {
			drops = append(drops, now)
		}
	}
	if len(drops) < 3 {
		t.Fatalf("got %d drops in 300 ms above target, want at least 3", len(drops))
	}
	if drops[0] != interval {
		t.Errorf("got first drop at %d ms, want %d ms (one interval above target)", drops[0]/ms, interval/ms)
	}
	// RFC 8289: the first drop of a dropping state sets count 1 and the
	// next drop an interval later; then count 2 and interval/sqrt(2), and
	// so on (to the simulation's step).
	for i, want := range []int64{100_000_000, 70_710_678} {
		got := drops[i+1] - drops[i]
		if got < want-step || got > want+step {
			t.Errorf("got gap %d→%d of %.2f ms, want %.2f ms", i, i+1, float64(got)/float64(ms), float64(want)/float64(ms))
		}
	}
	for now := 301 * ms; now < 1_000*ms; now += step {
		if c.shouldDrop(now, target/2, 100, target, interval) {
			t.Fatalf("dropped at %d ms after the sojourn fell below target", now/ms)
		}
	}
}

// fqHarness is a device with only what the fair queue touches: pools,
// the encryption queue and peers whose sequential queues the test reads.
type fqHarness struct {
	dev   *Device
	now   int64
	peers []*Peer
}

func newFQHarness(t *testing.T, npeers int) *fqHarness {
	t.Helper()
	h := &fqHarness{dev: new(Device)}
	h.dev.tun.device = tuntest.NewChannelTUN().TUN()
	h.dev.net.bind = conn.NewStdNetBind()
	h.dev.PopulatePools()
	h.dev.queue.encryption = newOutboundQueue()
	h.dev.SetFairQueue(0, 0)
	h.dev.fq.now = func() int64 { return h.now }
	for range npeers {
		p := &Peer{device: h.dev}
		p.queue.outbound = newAutodrainingOutboundQueue(h.dev)
		p.sequential.init()
		// The test is the peer's sequential sender: none starts on
		// demand (ondemand.go).
		p.sequential.send.running.Store(true)
		p.isRunning.Store(true)
		h.peers = append(h.peers, p)
	}
	return h
}

// enqueue queues n packets of size bytes for peer i, in batches of batch.
func (h *fqHarness) enqueue(i, n, size, batch int) {
	for n > 0 {
		c := h.dev.GetOutboundElementsContainer()
		c.Lock()
		for range min(n, batch) {
			elem := h.dev.NewOutboundElement()
			elem.packet = elem.buffer[MessageTransportHeaderSize : MessageTransportHeaderSize+size]
			elem.packet[0] = byte(i)
			c.elems = append(c.elems, elem)
		}
		n -= len(c.elems)
		h.dev.fqEnqueue(h.peers[i], c)
	}
}

// send takes the next handed-off batch, as an encryption worker and the
// sequential sender would, and returns its peer index and packet count;
// -1 if nothing is handed off.
func (h *fqHarness) send() (peer, packets int) {
	select {
	case c := <-h.dev.queue.encryption.c:
		c.Unlock()
		peer = int(c.elems[0].packet[0])
		if got := <-h.peers[peer].queue.outbound.c; got != c {
			panic("sequential queue out of order")
		}
		packets = len(c.elems)
		for _, elem := range c.elems {
			h.dev.PutMessageBuffer(elem.buffer)
			h.dev.PutOutboundElement(elem)
		}
		h.dev.PutOutboundElementsContainer(c)
		return peer, packets
	default:
		return -1, 0
	}
}

// TestFairQueueOnePacketBehindBulk: a peer's one packet queued behind
// another peer's backlog of thousands goes out within one turn of the
// bulk peer, not behind its backlog.
func TestFairQueueOnePacketBehindBulk(t *testing.T) {
	h := newFQHarness(t, 2)
	h.enqueue(0, fqPeerLimit, 1420, 128)
	h.enqueue(1, 1, 100, 128)
	bulkBefore := 0
	for {
		p, n := h.send()
		if p < 0 {
			t.Fatal("peer 1's packet never handed off")
		}
		if p == 1 {
			break
		}
		bulkBefore += n
	}
	// In flight when peer 1 arrived, plus at most one quantum and one unit.
	if max := fqInflightPackets + fqQuantum/1420 + fqUnit; bulkBefore > max {
		t.Errorf("got %d bulk packets handed off before peer 1's one, want at most %d", bulkBefore, max)
	}
	if d := h.dev.FairQueueDrops(); d != 0 {
		t.Errorf("got %d drops without time passing, want 0", d)
	}
}

// TestFairQueueSharesBetweenBulkPeers: two peers with standing backlogs
// get equal shares of what is handed off (to a quantum), whatever their
// batch sizes; a third peer's backlog does not change that.
func TestFairQueueSharesBetweenBulkPeers(t *testing.T) {
	h := newFQHarness(t, 2)
	h.enqueue(0, 1500, 1420, 128) // large batches
	h.enqueue(1, 1500, 1420, 4)   // small batches
	var got [2]int
	for got[0]+got[1] < 2000 {
		p, n := h.send()
		if p < 0 {
			t.Fatal("queue ran dry")
		}
		got[p] += n
	}
	// Peer 0's head start (the budget filled before peer 1 arrived) plus
	// a quantum's worth of slack.
	slack := fqInflightPackets + 2*fqQuantum/1420
	if diff := got[0] - got[1]; diff > slack || -diff > slack {
		t.Errorf("got shares %v packets, want equal to %d", got, slack)
	}
}

// TestFairQueueSojournDrop: a peer whose packets wait above target for
// longer than an interval loses packets; a peer that sends a packet now
// and then through the same device loses none.
func TestFairQueueSojournDrop(t *testing.T) {
	h := newFQHarness(t, 2)
	var sent1 int
	for round := 0; round < 400; round++ {
		// The bulk peer keeps 1,000 packets queued; 1 ms passes per
		// round and 64 packets are sent: its packets wait ~15 ms.
		if q := h.peers[0].fq.packets; q < 1000 {
			h.enqueue(0, 1000-q, 1420, 128)
		}
		if round%10 == 0 {
			h.enqueue(1, 1, 100, 128)
		}
		h.now += ms
		for sent := 0; sent < 64; {
			p, n := h.send()
			if p < 0 {
				break
			}
			if p == 1 {
				sent1 += n
			}
			sent += n
		}
	}
	drops := h.dev.FairQueueDrops()
	if drops == 0 {
		t.Fatal("got no drops from a queue standing above target for 400 ms")
	}
	// Every one of peer 1's 40 packets must come out.
	for {
		p, n := h.send()
		if p < 0 {
			break
		}
		if p == 1 {
			sent1 += n
		}
	}
	if sent1 != 40 {
		t.Errorf("got %d of peer 1's 40 packets sent, want all", sent1)
	}
	if st := &h.peers[1].fq; st.packets != 0 || st.codel.count != 0 {
		t.Errorf("got peer 1 with %d packets queued and codel count %d, want 0 and 0", st.packets, st.codel.count)
	}
}

// TestFairQueuePeerLimit: a batch that would take a peer past
// fqPeerLimit packets is dropped and counted; the budget is intact.
func TestFairQueuePeerLimit(t *testing.T) {
	h := newFQHarness(t, 1)
	h.enqueue(0, fqPeerLimit+fqInflightPackets+100, 1420, 100)
	if d := h.dev.FairQueueDrops(); d != 100 {
		t.Errorf("got %d drops, want 100", d)
	}
	total := 0
	for {
		_, n := h.send()
		if n == 0 {
			break
		}
		total += n
	}
	if want := fqPeerLimit + fqInflightPackets; total != want {
		t.Errorf("got %d packets sent, want %d", total, want)
	}
	if h.dev.fq.inflightPackets != 0 || h.dev.fq.inflightBatches != 0 {
		t.Errorf("got budget in use %d packets %d batches after draining, want 0", h.dev.fq.inflightPackets, h.dev.fq.inflightBatches)
	}
}

// TestFairQueueDevices runs two real devices with the fair queue on at
// one end or both, over real sockets: pings both ways (the handshake's
// staged packet too), then bursts whose packets must all arrive intact.
func TestFairQueueDevices(t *testing.T) {
	for _, tt := range []struct {
		name string
		fq   [2]bool
	}{{"both", [2]bool{true, true}}, {"one", [2]bool{true, false}}} {
		t.Run(tt.name, func(t *testing.T) {
			goroutineLeakCheck(t)
			pair := genTestPair(t, true)
			for i := range pair {
				if tt.fq[i] {
					pair[i].dev.SetFairQueue(0, 0)
				}
			}
			pair.Send(t, Ping, nil)
			pair.Send(t, Pong, nil)
			for _, dir := range []SendDirection{Ping, Pong} {
				from, to := pair[1], pair[0]
				if !dir {
					from, to = to, from
				}
				const n = 300
				msgs := make([][]byte, n)
				for i := range n {
					msg := tuntest.Ping(to.ip, from.ip)
					msg = binary.BigEndian.AppendUint32(msg, uint32(i))
					msg[3] = byte(len(msg)) // IPv4 total length (small packets)
					msgs[i] = msg
				}
				go func() {
					for _, msg := range msgs {
						from.tun.Outbound <- msg
					}
				}()
				// Upstream keeps a peer's packets in order on a quiet path
				// but does not promise it (TestRunToCompletion also keys
				// packets by payload); what must hold is that every packet
				// arrives intact.
				// A sender that does not slow down (this loop) loses to
				// CoDel what waits too long (a slow machine, -race): every
				// packet arrives or is counted as dropped.
				drops0 := from.dev.FairQueueDrops()
				timeout := time.After(10 * time.Second)
				seen := make([]bool, n)
				tick := time.NewTicker(20 * time.Millisecond)
				defer tick.Stop()
				for arrived := 0; arrived+int(from.dev.FairQueueDrops()-drops0) < n; {
					select {
					case got := <-to.tun.Inbound:
						k := binary.BigEndian.Uint32(got[len(got)-4:])
						if k >= n || seen[k] || !bytes.Equal(got, msgs[k]) {
							t.Fatalf("%s: got packet %x, not one of those sent or twice", dir, got)
						}
						seen[k] = true
						arrived++
					case <-tick.C:
					case <-timeout:
						t.Fatalf("%s: %d of %d packets arrived, %d dropped", dir, arrived, n, from.dev.FairQueueDrops()-drops0)
					}
				}
			}
		})
	}
}
