// SPDX-License-Identifier: MIT

package netstack

import (
	"errors"
	"io"
	"net"
	"sync"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/waiter"
)

// jobConn is the job's side of a relayed TCP flow: a gonet.TCPConn whose
// Read allocates nothing. gonet's Read registers a new waiter entry (a
// channel and an entry on the heap) every time it has to wait, and its
// writer escapes at every call: on the relay's hot path that is an
// allocation per wake-up. jobConn registers one entry for the
// connection's life and reuses one writer.
//
// Read is for one reader at a time (the relay's copy loop); it has no read
// deadline (the relay sets none). The entry stays registered until the
// endpoint and its queue are garbage (never unregistered: a Close from the
// other direction's goroutine must still wake a Read blocked on it, and
// the queue dies with the flow). Everything else is gonet's.
type jobConn struct {
	*gonet.TCPConn
	ep tcpip.Endpoint
	wq *waiter.Queue

	entry  waiter.Entry
	notify chan struct{}

	// readMu serialises Read, which owns w.
	readMu sync.Mutex
	w      tcpip.SliceWriter
}

func newJobConn(wq *waiter.Queue, ep tcpip.Endpoint) *jobConn {
	c := &jobConn{TCPConn: gonet.NewTCPConn(wq, ep), ep: ep, wq: wq}
	c.entry, c.notify = waiter.NewChannelEntry(waiter.ReadableEvents)
	wq.EventRegister(&c.entry)
	return c
}

// Read implements net.Conn.Read.
func (c *jobConn) Read(b []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	for {
		c.w = tcpip.SliceWriter(b)
		res, err := c.ep.Read(&c.w, tcpip.ReadOptions{})
		switch err.(type) {
		case nil:
			if res.Count != 0 {
				c.ep.ModerateRecvBuf(res.Count)
			}
			return res.Count, nil
		case *tcpip.ErrWouldBlock:
			<-c.notify
		case *tcpip.ErrClosedForReceive:
			return 0, io.EOF
		default:
			return 0, &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: errors.New(err.String())}
		}
	}
}
