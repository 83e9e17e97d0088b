// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/test/topology"
)

func TestBucketTake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b bucket
	if d := b.take(t0, 1e9); d != 0 {
		t.Fatalf("unlimited take: got %v, want 0", d)
	}
	b.set(t0, 1000, 500) // 1000 tokens/s, burst 500, starts full
	tests := []struct {
		at   time.Duration
		n    float64
		want time.Duration
	}{
		{0, 500, 0},                                // the burst
		{0, 100, 100 * time.Millisecond},           // 100 in debt
		{0, 100, 200 * time.Millisecond},           // 200 in debt
		{time.Second, 300, 0},                      // +1000 → capped at 500, -300 = 200
		{time.Second, 700, 500 * time.Millisecond}, // -500
		{3 * time.Second, 0, 0},                    // back to the burst
	}
	for i, tc := range tests {
		if got := b.take(t0.Add(tc.at), tc.n); got != tc.want {
			t.Errorf("step %d: take(%v, %v): got %v, want %v", i, tc.at, tc.n, got, tc.want)
		}
	}
}

// TestBucketRate checks the long-run rate: taking in chunks and waiting as
// told moves exactly rate × time, plus the burst.
func TestBucketRate(t *testing.T) {
	now := time.Unix(1000, 0)
	var b bucket
	b.setBits(now, 100e6) // 12.5 MB/s
	start := now
	var moved float64
	for now.Sub(start) < 10*time.Second {
		moved += maxChunk
		now = now.Add(b.take(now, maxChunk))
	}
	got := moved / now.Sub(start).Seconds() * 8
	if got < 99e6 || got > 101e6 {
		t.Errorf("rate over 10 s: got %.1f Mbit/s, want 100 ±1%%", got/1e6)
	}
}

func TestBucketAllow(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var b bucket
	b.set(t0, 10, 3)
	var got []bool
	for range 5 {
		got = append(got, b.allow(t0, 1))
	}
	want := []bool{true, true, true, false, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("allow at once: got %v, want %v", got, want)
		}
	}
	if !b.allow(t0.Add(100*time.Millisecond), 1) || b.allow(t0.Add(100*time.Millisecond), 1) {
		t.Errorf("after 100 ms at 10/s: want exactly one more allowed")
	}
	// Lowering the rate keeps the balance within the new burst; an
	// unlimited bucket allows everything.
	b.set(t0.Add(time.Second), 0, 0)
	if !b.allow(t0.Add(time.Second), 1e9) {
		t.Errorf("unlimited bucket refused")
	}
}

func TestJobLimitsAdmit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var j jobLimits
	j.apply(t0, limits.Job{MaxFlows: 2})
	if a, b, c := j.admit(t0), j.admit(t0), j.admit(t0); a != admitted || b != admitted || c != tooManyFlows {
		t.Fatalf("max 2 flows: got %v %v %v, want admitted admitted tooManyFlows", a, b, c)
	}
	j.release()
	if got := j.admit(t0); got != admitted {
		t.Fatalf("after a release: got %v, want admitted", got)
	}
	j.release()
	j.release()

	j.apply(t0, limits.Job{NewFlowsPerSec: 2.5}) // burst 3
	var ok, fast int
	for range 10 {
		switch j.admit(t0) {
		case admitted:
			ok++
		case tooFast:
			fast++
		}
	}
	if ok != 3 || fast != 7 {
		t.Errorf("2.5 new flows/s at once: got %d admitted, %d too fast; want 3, 7", ok, fast)
	}
	if got := j.flows.Load(); got != 3 {
		t.Errorf("open flows after refusals: got %d, want 3 (refusals are not counted)", got)
	}
	if got := j.admit(t0.Add(400 * time.Millisecond)); got != admitted {
		t.Errorf("400 ms later (1 token): got %v, want admitted", got)
	}
}

// TestTCPShaped relays 1 MiB each way through a job limited to 8 Mbit/s
// (1 MB/s) egress and ingress; each direction must take at least the time
// the rate allows (a lower bound: a loaded machine only slows it).
func TestTCPShaped(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) { testTCPShaped(t, name) })
	}
}

func testTCPShaped(t *testing.T, stackName string) {
	checkGoroutines(t)
	const size = 1 << 20
	const rate = 8e6
	srv := listenTCP(t, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, io.LimitReader(c, size))
		if n == size {
			c.Write(make([]byte, size))
		}
	})
	p := newPair(t, tcpStackConfig(t, stackName))
	p.dial.route("198.51.100.7:80", srv)
	if err := p.s.AddJob(testJob("L", jobAddr)); err != nil {
		t.Fatal(err)
	}
	if err := p.s.SetJobLimits("L", limits.Job{EgressBitsPerSec: rate, IngressBitsPerSec: rate}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := p.jobDialTCP(ctx, "198.51.100.7:80")
	if err != nil {
		t.Fatalf("job dial: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	start := time.Now()
	if _, err := c.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	n, err := io.ReadFull(c, make([]byte, size))
	if err != nil {
		t.Fatalf("job read: %d bytes, %v", n, err)
	}
	elapsed := time.Since(start)
	// Each direction passes its shaper in full before the next starts
	// (the server answers after reading everything): size at rate,
	// minus the burst and one chunk of debt (64 KiB each), minus 64 KiB
	// of margin.
	min := 2 * time.Duration(float64((size-3*maxChunk)*8)/rate*float64(time.Second))
	t.Logf("1 MiB up and down at 8 Mbit/s: %v (lower bound %v)", elapsed, min)
	if elapsed < min {
		t.Errorf("transfer took %v, want at least %v at 8 Mbit/s each way", elapsed, min)
	}
}

// TestFlowLimits checks that the (N+1)-th concurrent connection of a job
// is reset at once while the first N keep working, that a job without
// limits is unaffected, and that the new-flow rate refuses the excess.
func TestFlowLimits(t *testing.T) {
	for _, name := range tcpStacks {
		t.Run(name, func(t *testing.T) { testFlowLimits(t, name) })
	}
}

func testFlowLimits(t *testing.T, stackName string) {
	checkGoroutines(t)
	srv := listenTCP(t, func(c net.Conn) {
		b := make([]byte, 1)
		for {
			if _, err := c.Read(b); err != nil {
				return
			}
			c.Write(b)
		}
	})
	p := newPair(t, tcpStackConfig(t, stackName))
	p.dial.route("198.51.100.7:7", srv)
	if err := p.s.SetJobLimits("L", limits.Job{MaxFlows: 2}); !errors.Is(err, forward.ErrUnknownJob) {
		t.Errorf("SetJobLimits before AddJob: got %v, want ErrUnknownJob", err)
	}
	if err := p.s.AddJob(testJob("L", jobAddr)); err != nil {
		t.Fatal(err)
	}
	if err := p.s.SetJobLimits("L", limits.Job{MaxFlows: 2}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 2 {
		c, err := p.jobDialTCP(ctx, "198.51.100.7:7")
		if err != nil {
			t.Fatalf("connection %d of 2: %v", i+1, err)
		}
		conns = append(conns, c)
	}
	start := time.Now()
	c, err := p.jobDialTCP(ctx, "198.51.100.7:7")
	if err == nil {
		c.Close()
		t.Fatal("third connection with max 2 flows: succeeded, want refused")
	}
	if d := time.Since(start); d > time.Second || !isRefused(err) {
		t.Errorf("third connection: %v after %v, want refused within 1 s", err, d)
	}
	for i, c := range conns {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b := []byte{byte('a' + i)}
		if _, err := c.Write(b); err != nil {
			t.Fatalf("connection %d write: %v", i+1, err)
		}
		if _, err := io.ReadFull(c, b); err != nil || b[0] != byte('a'+i) {
			t.Errorf("connection %d echo: %q %v", i+1, b, err)
		}
	}
	// Closing one frees its slot.
	conns[0].Close()
	conns = conns[1:]
	if !topology.Poll(5*time.Second, func() bool {
		var c net.Conn
		c, err = p.jobDialTCP(ctx, "198.51.100.7:7")
		if err == nil {
			conns = append(conns, c)
		}
		return err == nil
	}) {
		t.Fatalf("after closing a connection: %v, want a free slot", err)
	}
	// Lifting the limit lets more in.
	if err := p.s.SetJobLimits("L", limits.Job{}); err != nil {
		t.Fatal(err)
	}
	c, err = p.jobDialTCP(ctx, "198.51.100.7:7")
	if err != nil {
		t.Fatalf("after lifting the limit: %v", err)
	}
	conns = append(conns, c)

	// New flows per second: 2/s with 3 connections open, 6 more at once:
	// 2 pass (the burst), 4 are refused.
	if err := p.s.SetJobLimits("L", limits.Job{NewFlowsPerSec: 2}); err != nil {
		t.Fatal(err)
	}
	var ok, refused int
	for range 6 {
		c, err := p.jobDialTCP(ctx, "198.51.100.7:7")
		if err != nil {
			refused++
			continue
		}
		ok++
		conns = append(conns, c)
	}
	// The loop may take long on a loaded machine and refill a token.
	if ok < 2 || ok > 3 || refused < 3 {
		t.Errorf("6 connections at 2 new flows/s: %d ok, %d refused; want 2 (or 3) ok", ok, refused)
	}
	st := p.s.limitStats()
	// The slot of a closed connection frees when its relay ends, so the
	// retries above may have been refused too.
	if st.FlowsRefused < 1 || st.RateRefused != uint64(refused) {
		t.Errorf("LimitStats: got %+v, want at least 1 flow refusal and %d rate refusals", st, refused)
	}
}

// TestUDPShaped checks that datagrams over a job's rate are dropped and
// counted.
func TestUDPShaped(t *testing.T) {
	checkGoroutines(t)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	p := newPair(t, Config{})
	p.dial.route("198.51.100.7:9", pc.LocalAddr().String())
	if err := p.s.AddJob(testJob("L", jobAddr)); err != nil {
		t.Fatal(err)
	}
	// 800 kbit/s = 100 kB/s; the burst is one 64 KiB chunk.
	if err := p.s.SetJobLimits("L", limits.Job{EgressBitsPerSec: 800e3}); err != nil {
		t.Fatal(err)
	}
	c := p.jobDialUDP(t, "198.51.100.7:9")
	payload := make([]byte, 1000)
	start := time.Now()
	for range 200 {
		c.Write(payload)
	}
	pc.SetReadDeadline(time.Now().Add(time.Second))
	buf := make([]byte, 2000)
	got := 0
	for {
		if _, _, err := pc.ReadFrom(buf); err != nil {
			break
		}
		got++
	}
	// At most the burst (65 datagrams) plus what the rate allows while
	// sending.
	max := 66 + int(time.Since(start).Seconds()*100)
	st := p.s.limitStats()
	t.Logf("200 datagrams of 1000 bytes at 800 kbit/s: %d arrived, %d dropped", got, st.Dropped)
	if got == 0 || got > max || st.Dropped == 0 {
		t.Errorf("arrived %d (want 1..%d), dropped %d (want > 0)", got, max, st.Dropped)
	}
}
