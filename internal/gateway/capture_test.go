// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestCapture runs a standing feed (--capture to a file) and an admin's
// live capture of one job with a filter, in process: both hold the job's
// request with its tunnel address as source; the live capture ends when
// the job's lease does; the feed's file is 0600 and its metrics count.
func TestCapture(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); c.Write([]byte("HTTP/1.0 200 OK\r\n\r\n")) }()
		}
	}()
	feed := filepath.Join(t.TempDir(), "feed.pcap")
	reg := prometheus.NewRegistry()
	g := startGatewayWith(t, func(c *Config) { c.Capture = []string{feed}; c.Registry = reg; c.LeaseTTL = 10 * time.Second },
		remote{job: "198.51.100.7:80", real: ln.Addr().String()})
	j := joinJob(t, g, newToken(t, g))
	ac, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := ac.Capture(ctx, admin.CaptureRequest{Job: "no-such-job"}); err == nil || !strings.Contains(err.Error(), "no live lease") {
		t.Errorf("capture of an unknown job: got %v, want no live lease", err)
	}
	if _, err := ac.Capture(ctx, admin.CaptureRequest{Job: "t1", Filter: "port http"}); err == nil {
		t.Error("capture with a bad filter: got nil error")
	}
	live, err := ac.Capture(ctx, admin.CaptureRequest{Job: "t1", Filter: "tcp port 80"})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	got := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(live); got <- b }()

	req := "GET /capture-test HTTP/1.0\r\nHost: example.org\r\n\r\n"
	c, err := j.net.DialContext(ctx, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte(req))
	io.Copy(io.Discard, c)
	c.Close()
	if u, err := j.net.DialContext(ctx, "udp", "198.51.100.7:9"); err == nil { // not "tcp port 80"
		u.Write([]byte("udp-not-captured"))
		u.Close()
	}
	// The feed file (every packet) has the datagram, sent last: the
	// gateway has passed every packet of the job to its captures.
	var fileStream []byte
	topology.Poll(5*time.Second, func() bool {
		fileStream, _ = os.ReadFile(feed)
		return bytes.Contains(fileStream, []byte("udp-not-captured"))
	})
	// Ending the job's lease ends its live capture.
	if _, err := ac.Kick(ctx, admin.KickRequest{Job: "t1", Reason: "capture test"}); err != nil {
		t.Fatal(err)
	}
	var stream []byte
	select {
	case stream = <-got:
	case <-ctx.Done():
		t.Fatal("the live capture did not end with the job's lease")
	}
	job := j.lease.Addresses[0].Addr()
	checkStream := func(name string, b []byte, wantUDP bool) {
		t.Helper()
		n, src, found, udp := 0, false, false, false
		for _, p := range pcapPackets(t, b) {
			n++
			if len(p) >= 20 && netip.AddrFrom4([4]byte(p[12:16])) == job && bytes.Contains(p, []byte(req)) {
				src, found = true, true
			}
			udp = udp || bytes.Contains(p, []byte("udp-not-captured"))
		}
		if !found || !src {
			t.Errorf("%s: %d packets, none from %s holds the request", name, n, job)
		}
		if udp != wantUDP {
			t.Errorf("%s: UDP datagram captured: got %v, want %v", name, udp, wantUDP)
		}
	}
	checkStream("live capture", stream, false)
	checkStream("feed file", fileStream, true)
	if fi, err := os.Stat(feed); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("feed file: %v, mode %v, want 0600", err, fi.Mode().Perm())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "airlock_capture_packets_total" {
			for _, m := range mf.GetMetric() {
				series[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if series["flag"] < 3 || series["live"] < 3 {
		t.Errorf("airlock_capture_packets_total: got %v, want flag and live with a TCP connection's packets each", series)
	}
}

// pcapPackets returns the packets of a raw-IP pcap stream.
func pcapPackets(t *testing.T, b []byte) [][]byte {
	t.Helper()
	if len(b) < 24 || binary.LittleEndian.Uint32(b) != 0xa1b2c3d4 || binary.LittleEndian.Uint32(b[20:]) != 101 {
		t.Fatalf("not a raw-IP pcap stream: %x", b[:min(len(b), 24)])
	}
	var out [][]byte
	for b = b[24:]; len(b) >= 16; {
		n := int(binary.LittleEndian.Uint32(b[8:]))
		if len(b) < 16+n {
			break // a record still being written
		}
		out = append(out, b[16:16+n])
		b = b[16+n:]
	}
	return out
}
