// SPDX-License-Identifier: MIT

package tunnel

import (
	"net"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
)

// TestSocketWatch opens wireguard-go's bind, reads its buffers back, then
// overflows a receive buffer nobody reads and checks that the drops are
// counted.
func TestSocketWatch(t *testing.T) {
	b := conn.NewStdNetBind()
	_, port, err := b.Open(0)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	w := NewSocketWatch(port)
	st, err := w.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.Sockets == 0 || st.RcvBuf == 0 || st.SndBuf == 0 {
		t.Fatalf("stats %+v: want the bind's sockets and their buffers", st)
	}
	t.Logf("bind on udp port %d: %+v (asked for %d)", port, st, SocketBufferSize)
	// Nobody reads the bind: a flood fills its receive buffer.
	c, err := net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: int(port)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	payload := make([]byte, 1400)
	sent := 0
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		for range 1000 {
			c.Write(payload)
			sent++
		}
		if st, _ = w.Stats(); st.Drops > 0 {
			break
		}
	}
	if st.Drops == 0 {
		t.Fatalf("after %d datagrams to an unread socket: no drops counted (%+v)", sent, st)
	}
	t.Logf("%d datagrams sent, %d dropped", sent, st.Drops)
}
