// SPDX-License-Identifier: MIT

package gateway

import (
	"net"
	"testing"
	"time"
)

// TestMaxConnsPerSource: Config.MaxConnsPerSource (airlock gateway
// --max-conns-per-source) reaches the control server: with 2, a third
// connection from the same address is closed as it is accepted, while
// the first two stay open.
func TestMaxConnsPerSource(t *testing.T) {
	g := startGatewayWith(t, func(c *Config) { c.MaxConnsPerSource = 2 })
	var conns []net.Conn
	for range 3 {
		c, err := net.Dial("tcp", g.info.Control.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
	}
	closed := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(time.Second))
		_, err := c.Read(make([]byte, 1))
		ne, ok := err.(net.Error)
		return !(ok && ne.Timeout())
	}
	if !closed(conns[2]) {
		t.Error("a third connection from one source with --max-conns-per-source 2: still open, want it closed at accept")
	}
	for i, c := range conns[:2] {
		if closed(c) {
			t.Errorf("connection %d of 2 closed, want it open", i+1)
		}
	}
}
