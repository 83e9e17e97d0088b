// SPDX-License-Identifier: MIT

package main

import (
	"net"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestLoopback runs the client against the server on loopback: every round
// trip is counted and the percentiles are ordered.
func TestLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	go func() { _ = serve(addr) }()
	var res Result
	topology.Poll(5*time.Second, func() bool { // until the server listens
		res, err = client(addr, 20, 64, 0, 5*time.Second)
		return err == nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.N != 20 || res.P50ms <= 0 || res.P99ms < res.P50ms || res.Maxms < res.P99ms {
		t.Errorf("got %+v, want 20 ordered round trips", res)
	}
}
