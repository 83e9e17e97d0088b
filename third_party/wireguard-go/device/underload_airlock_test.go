/* SPDX-License-Identifier: MIT
 *
 * Airlock's patch: the test of awaitsResponse (receive.go).
 */

package device

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"
)

// TestUnderLoadOwnInitiation: a device under load that initiates a
// handshake completes it with the peer's first response, without the
// cookie round that would hold it until the initiation's retry (5 s).
func TestUnderLoadOwnInitiation(t *testing.T) {
	// Real sockets: the channel binds of genTestPair(t, false) report every
	// datagram as from one endpoint whatever port the peer was given, and
	// the exemption wants the response from the endpoint the initiation
	// went to.
	pair := genTestPair(t, true)
	gw, job := pair[0].dev, pair[1].dev
	gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())
	if !gw.IsUnderLoad() {
		t.Fatal("device not under load")
	}
	peer := gw.LookupPeer(job.staticIdentity.publicKey)
	if peer == nil {
		t.Fatal("no peer for the other device")
	}
	if err := peer.SendHandshakeInitiation(false); err != nil {
		t.Fatalf("send initiation: %v", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for peer.lastHandshakeNano.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no handshake within 2 s of the initiation under load: the response went through a cookie round")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAwaitsResponse: only a response-sized packet whose receiver index
// names a handshake waiting for its response, from the endpoint the
// initiation went to, passes, and only once per initiation; anything else
// keeps the cookie round and the per-source limit.
func TestAwaitsResponse(t *testing.T) {
	pair := genTestPair(t, false)
	dev := pair[0].dev
	peer := dev.LookupPeer(pair[1].dev.staticIdentity.publicKey)
	peer.endpoint.Lock()
	sentTo := peer.endpoint.val
	peer.endpoint.Unlock()
	elsewhere, err := dev.net.bind.ParseEndpoint("127.0.0.1:77")
	if err != nil {
		t.Fatal(err)
	}
	init, err := dev.CreateMessageInitiation(peer)
	if err != nil {
		t.Fatalf("create initiation: %v", err)
	}
	resp := make([]byte, MessageResponseSize)
	binary.LittleEndian.PutUint32(resp, MessageResponseType)
	binary.LittleEndian.PutUint32(resp[8:], init.Sender)
	if dev.awaitsResponse(resp[:MessageResponseSize-1], sentTo) {
		t.Error("a short packet passes")
	}
	other := make([]byte, MessageResponseSize)
	rand.Read(other)
	binary.LittleEndian.PutUint32(other[8:], init.Sender+1)
	if dev.awaitsResponse(other, sentTo) {
		t.Error("a response with another receiver index passes")
	}
	if dev.awaitsResponse(resp, elsewhere) {
		t.Error("a response from another endpoint than the initiation's passes")
	}
	if dev.awaitsResponse(resp, nil) {
		t.Error("a response without an endpoint passes")
	}
	if !dev.awaitsResponse(resp, sentTo) {
		t.Error("a response to the pending initiation is not recognised")
	}
	if dev.awaitsResponse(resp, sentTo) {
		t.Error("a second response to the same initiation passes: the exemption is once per initiation")
	}
	// A new initiation (the 5-s retry) has an exemption of its own.
	init, err = dev.CreateMessageInitiation(peer)
	if err != nil {
		t.Fatalf("create initiation: %v", err)
	}
	binary.LittleEndian.PutUint32(resp[8:], init.Sender)
	if !dev.awaitsResponse(resp, sentTo) {
		t.Error("the response to a new initiation is not recognised")
	}
	// Once the handshake has moved on (here: the peer's own initiation
	// consumed, state reset), its index no longer passes.
	init, _ = dev.CreateMessageInitiation(peer)
	binary.LittleEndian.PutUint32(resp[8:], init.Sender)
	peer.handshake.mutex.Lock()
	peer.handshake.state = handshakeZeroed
	peer.handshake.mutex.Unlock()
	if dev.awaitsResponse(resp, sentTo) {
		t.Error("a response to a handshake that no longer waits passes")
	}
}

// TestUnderLoadForgedResponseFlood: a lease holder who read the receiver
// index of the gateway's pending initiation to a job (after a gateway
// restart, or at a re-key) floods the gateway, under load, with forged
// responses carrying that index and a valid mac1, from the job's own
// endpoint and from other sources. Each forged response that reaches the
// handshake's cryptography costs two X25519 operations; only one per
// initiation sent may get there (the exemption is spent once, and only from
// the endpoint the initiation went to). Meanwhile the gateway's handshakes
// with 20 other jobs complete without waiting for a retry, and their
// traffic passes.
func TestUnderLoadForgedResponseFlood(t *testing.T) {
	const jobs, forged = 20, 4000
	var invalid atomic.Int64
	gwLog := &Logger{
		Verbosef: func(format string, args ...any) {
			if strings.HasPrefix(format, "Received invalid response message") {
				invalid.Add(1)
			}
		},
		Errorf: func(format string, args ...any) { t.Logf("gateway: "+format, args...) },
	}
	gwKey, gwPub := testKeyPair(t)
	gwTUN := tuntest.NewChannelTUN()
	gw := NewDevice(gwTUN.TUN(), conn.NewDefaultBind(), gwLog)
	t.Cleanup(gw.Close)
	if err := gw.IpcSet(uapiCfg("private_key", hex.EncodeToString(gwKey[:]), "listen_port", "0")); err != nil {
		t.Fatal(err)
	}
	if err := gw.Up(); err != nil {
		t.Fatal(err)
	}
	gwAddr := fmt.Sprintf("127.0.0.1:%d", gw.net.port)

	// The victim: a job whose endpoint is a socket the attacker holds.
	victim, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	_, victimPub := testKeyPair(t)
	if err := gw.IpcSet(uapiCfg("public_key", hex.EncodeToString(victimPub[:]),
		"allowed_ip", "10.9.0.1/32", "endpoint", victim.LocalAddr().String())); err != nil {
		t.Fatal(err)
	}

	type job struct {
		tun  *tuntest.ChannelTUN
		ip   netip.Addr
		peer *Peer
	}
	var js []job
	for i := range jobs {
		key, pub := testKeyPair(t)
		j := job{tun: tuntest.NewChannelTUN(), ip: netip.AddrFrom4([4]byte{10, 9, 1, byte(i + 1)})}
		dev := NewDevice(j.tun.TUN(), conn.NewDefaultBind(), NewLogger(LogLevelError, fmt.Sprintf("job%d: ", i)))
		t.Cleanup(dev.Close)
		if err := dev.IpcSet(uapiCfg("private_key", hex.EncodeToString(key[:]), "listen_port", "0",
			"public_key", hex.EncodeToString(gwPub[:]), "allowed_ip", "10.9.255.254/32", "endpoint", gwAddr)); err != nil {
			t.Fatal(err)
		}
		if err := dev.Up(); err != nil {
			t.Fatal(err)
		}
		if err := gw.IpcSet(uapiCfg("public_key", hex.EncodeToString(pub[:]), "allowed_ip", j.ip.String()+"/32",
			"endpoint", fmt.Sprintf("127.0.0.1:%d", dev.net.port))); err != nil {
			t.Fatal(err)
		}
		j.peer = gw.LookupPeer(pub)
		js = append(js, j)
	}
	gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())

	// The attacker reads the index from the gateway's initiation to the
	// victim, and counts the initiations it is sent (the 5-s retries).
	if err := gw.LookupPeer(victimPub).SendHandshakeInitiation(false); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	victim.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := victim.ReadFromUDP(buf)
	if err != nil || n != MessageInitiationSize || binary.LittleEndian.Uint32(buf) != MessageInitiationType {
		t.Fatalf("no initiation at the victim's endpoint: %d bytes, %v", n, err)
	}
	index := binary.LittleEndian.Uint32(buf[4:8])
	var initiations atomic.Int64
	initiations.Add(1)
	go func() {
		for {
			victim.SetReadDeadline(time.Now().Add(30 * time.Second))
			n, _, err := victim.ReadFromUDP(buf)
			if err != nil {
				return
			}
			if n == MessageInitiationSize && binary.LittleEndian.Uint32(buf) == MessageInitiationType {
				initiations.Add(1)
			}
		}
	}()
	other, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	gwUDP := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(gw.net.port)}
	var macs CookieGenerator
	macs.Init(gwPub)

	var before, after syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &before)
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		msg := make([]byte, MessageResponseSize)
		for k := range forged {
			if k%100 == 0 {
				// Hold the device under load: paced, the flood alone
				// would let it drop out a second after the queue
				// drains, and a device not under load does the
				// cryptography of every response (upstream's design:
				// it has the capacity then).
				gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())
			}
			rand.Read(msg)
			binary.LittleEndian.PutUint32(msg, MessageResponseType)
			binary.LittleEndian.PutUint32(msg[8:], index)
			macs.AddMacs(msg)
			from := victim
			if k%2 == 1 {
				from = other
			}
			from.WriteToUDP(msg, gwUDP)
			if k%100 == 99 {
				// 4,000 a second: what one job's node sends without
				// filling the handshake queue, which drops any
				// datagram when full, forged or not (upstream too).
				time.Sleep(25 * time.Millisecond)
			}
		}
	}()
	for _, j := range js {
		if err := j.peer.SendHandshakeInitiation(false); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(4 * time.Second) // below the initiation's 5-s retry
	for _, j := range js {
		for j.peer.lastHandshakeNano.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("job %v: no handshake within 4 s of the gateway's initiation during the flood", j.ip)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	gwIP := netip.AddrFrom4([4]byte{10, 9, 255, 254})
	for _, j := range js {
		for _, dir := range []struct {
			from, to *tuntest.ChannelTUN
			msg      []byte
		}{{gwTUN, j.tun, tuntest.Ping(j.ip, gwIP)}, {j.tun, gwTUN, tuntest.Ping(gwIP, j.ip)}} {
			dir.from.Outbound <- dir.msg
			select {
			case got := <-dir.to.Inbound:
				if !bytes.Equal(got, dir.msg) {
					t.Fatalf("job %v: packet changed in transit", j.ip)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("job %v: no traffic during the flood", j.ip)
			}
		}
	}
	<-flooded
	for drain := time.Now().Add(10 * time.Second); len(gw.queue.handshake.c) > 0 && time.Now().Before(drain); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // the last element dequeued is handled
	syscall.Getrusage(syscall.RUSAGE_SELF, &after)
	cpu := time.Duration(after.Utime.Nano() + after.Stime.Nano() - before.Utime.Nano() - before.Stime.Nano())
	t.Logf("%d forged responses: %d reached the handshake's cryptography, %d initiation(s) sent to the victim; process CPU %v", forged, invalid.Load(), initiations.Load(), cpu)
	if got, max := invalid.Load(), initiations.Load(); got > max {
		t.Errorf("%d forged responses reached the handshake's cryptography, want at most one per initiation sent (%d)", got, max)
	}
}

func testKeyPair(t *testing.T) (NoisePrivateKey, NoisePublicKey) {
	t.Helper()
	var k NoisePrivateKey
	if _, err := rand.Read(k[:]); err != nil {
		t.Fatal(err)
	}
	return k, k.publicKey()
}
