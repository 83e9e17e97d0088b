// SPDX-License-Identifier: MIT

package netstack

import (
	"net"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRelayLowWater checks that the relay sets TCP_NOTSENT_LOWAT on both
// of its kernel sockets.
func TestRelayLowWater(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	pair := func() (net.Conn, net.Conn) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		a, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		return c, a
	}
	in, inPeer := pair()
	out, outPeer := pair()
	defer inPeer.Close()
	defer outPeer.Close()
	s := &Stack{}
	done := make(chan struct{})
	go func() { defer close(done); s.relayTCP(in, out, nil, nil, nil) }()
	// One byte each way proves the relay runs (and set the option first).
	inPeer.Write([]byte("x"))
	b := make([]byte, 1)
	if _, err := outPeer.Read(b); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]net.Conn{"job side": in, "outside": out} {
		rc, _ := c.(*net.TCPConn).SyscallConn()
		var v int
		var gerr error
		rc.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT) })
		if gerr != nil || v != relayLowWater {
			t.Errorf("%s: TCP_NOTSENT_LOWAT %d (%v), want %d", name, v, gerr, relayLowWater)
		}
	}
	inPeer.Close()
	outPeer.Close()
	<-done
}
