// SPDX-License-Identifier: MIT

package tunnel

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
)

// probeGateway opens a Bind that answers probes of key on loopback and
// pumps its IPv4 receive function; it returns the UDP endpoint.
func probeGateway(t *testing.T, key *ProbeKey) (*Bind, netip.AddrPort) {
	t.Helper()
	b := NewBind(conn.NewStdNetBind(), nil)
	b.AnswerProbes(key)
	fns, port, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { b.Close(); wg.Wait() })
	for _, fn := range fns[:len(fns)-1] { // not the streams'
		wg.Add(1)
		go func() {
			defer wg.Done()
			bufs := make([][]byte, b.BatchSize())
			for i := range bufs {
				bufs[i] = make([]byte, 1<<16)
			}
			sizes := make([]int, len(bufs))
			eps := make([]conn.Endpoint, len(bufs))
			for {
				if _, err := fn(bufs, sizes, eps); errors.Is(err, net.ErrClosed) {
					return
				}
			}
		}()
	}
	return b, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port)
}

// dropBig relays UDP between a local port and to, dropping datagrams
// longer than limit in both directions, as a middlebox that silently
// drops big frames would. It returns the port to send to.
func dropBig(t *testing.T, to netip.AddrPort, limit int) netip.AddrPort {
	t.Helper()
	front, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	back, err := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(to))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var client *net.UDPAddr
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 1<<16)
		for {
			n, from, err := front.ReadFromUDP(buf)
			if err != nil {
				return
			}
			mu.Lock()
			client = from
			mu.Unlock()
			if n <= limit {
				back.Write(buf[:n])
			}
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		buf := make([]byte, 1<<16)
		for {
			n, err := back.Read(buf)
			if errors.Is(err, net.ErrClosed) {
				return
			}
			mu.Lock()
			c := client
			mu.Unlock()
			if err == nil && n <= limit && c != nil {
				front.WriteToUDP(buf[:n], c)
			}
		}
	}()
	t.Cleanup(func() { front.Close(); back.Close(); <-done; <-done })
	return front.LocalAddr().(*net.UDPAddr).AddrPort()
}

func TestProbeMTU(t *testing.T) {
	key, err := NewProbeKey()
	if err != nil {
		t.Fatal(err)
	}
	other, _ := NewProbeKey()
	b, ep := probeGateway(t, key)
	ctx := context.Background()
	tok := key.Token(time.Now())
	tests := []struct {
		name    string
		ep      netip.AddrPort
		token   []byte
		max     int
		want    int
		wantErr bool
	}{
		{"answered", ep, tok, 8920, 8920, false},
		{"not offered", ep, tok, 1420, 1420, false},
		{"token of another gateway", ep, other.Token(time.Now()), 8920, 1420, true},
		{"expired token", ep, key.Token(time.Now().Add(-2 * ProbeTokenTTL)), 8920, 1420, true},
		{"big datagrams dropped", dropBig(t, ep, 1500), tok, 8920, 1420, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			got, err := ProbeMTU(ctx, ProbeConfig{Endpoint: tt.ep, Token: tt.token, Max: tt.max, Fallback: 1420})
			if got != tt.want || (err != nil) != tt.wantErr {
				t.Fatalf("ProbeMTU = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
			if err != nil && !errors.Is(err, ErrProbeUnanswered) {
				t.Errorf("error %v is not ErrProbeUnanswered", err)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("ProbeMTU took %v, want at most its 600-ms wait", d)
			}
			t.Logf("%d after %v (err %v)", got, time.Since(start).Round(time.Millisecond), err)
		})
	}
	if a, r := b.ProbeCounts(); a == 0 || r == 0 {
		t.Errorf("ProbeCounts = %d answered, %d refused; want both > 0", a, r)
	}
}

// TestProbeReply checks that a reply is never larger than its request and
// that malformed requests get none.
func TestProbeReply(t *testing.T) {
	key, _ := NewProbeKey()
	p := &prober{key: key, now: time.Now, tokens: probeBurst, last: time.Now()}
	req := make([]byte, 3000)
	copy(req, probeMagic[:])
	req[4] = probeRequest
	copy(req[16:], key.Token(time.Now()))
	if r := p.reply(req); len(r) != len(req) || !isProbe(r, probeReply) {
		t.Fatalf("reply of %d bytes (probe %v), want %d", len(r), isProbe(r, probeReply), len(req))
	}
	for _, n := range []int{0, 4, 16, probeReqLen - 1} {
		if r := p.reply(req[:n]); r != nil {
			t.Errorf("reply to a %d-byte request: %d bytes, want none", n, len(r))
		}
	}
	// The rate limit: a burst, then nothing until time passes.
	now := time.Now()
	p = &prober{key: key, now: func() time.Time { return now }, tokens: probeBurst, last: now}
	n := 0
	for range 3 * probeBurst {
		if p.reply(req) != nil {
			n++
		}
	}
	if n != probeBurst {
		t.Errorf("%d replies at one instant, want the burst %d", n, probeBurst)
	}
}

func TestOverhead(t *testing.T) {
	for _, tt := range []struct {
		a    string
		want int
	}{{"192.0.2.1", 60}, {"::ffff:192.0.2.1", 60}, {"2001:db8::1", 80}} {
		if got := Overhead(netip.MustParseAddr(tt.a)); got != tt.want {
			t.Errorf("Overhead(%s) = %d, want %d", tt.a, got, tt.want)
		}
	}
}
