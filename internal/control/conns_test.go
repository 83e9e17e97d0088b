// SPDX-License-Identifier: MIT

package control

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// TestConnsPerSource (issue 33, item 6): a source holds at most max
// connections; the next is closed as it is accepted, and a closed one
// makes room again.
func TestConnsPerSource(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := newConnTracker(2, func(slog.Level, string, ...any) {})
	l := tr.listener(ln)
	defer l.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	a, b := dial(), dial()
	first := <-accepted
	<-accepted
	third := dial()
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := third.Read(make([]byte, 1)); err != io.EOF {
		t.Errorf("a third connection of a source that may hold 2: read %v, want it closed (EOF)", err)
	}
	first.Close()
	a.Close()
	dial()
	select {
	case <-accepted:
	case <-time.After(5 * time.Second):
		t.Error("after one of the two closed, a new connection was not accepted")
	}
	_ = b
}

// TestUnauthenticatedIdleClosed (issue 33, item 6): an idle connection
// that carried no authenticated request is closed after idleFor; one that
// did is left to the server's idle timeout.
func TestUnauthenticatedIdleClosed(t *testing.T) {
	tr := newConnTracker(0, func(slog.Level, string, ...any) {})
	tr.idleFor = 50 * time.Millisecond
	for _, authed := range []bool{false, true} {
		c, peer := net.Pipe()
		ctx := tr.connContext(context.Background(), c)
		if authed {
			markAuthed(ctx)
		}
		tr.connState(c, http.StateActive)
		tr.connState(c, http.StateIdle)
		peer.SetReadDeadline(time.Now().Add(time.Second))
		_, err := peer.Read(make([]byte, 1))
		if closed := err == io.EOF; closed == authed {
			t.Errorf("authenticated %v, idle: read %v; want closed %v", authed, err, !authed)
		}
		c.Close()
		tr.connState(c, http.StateClosed)
	}
}

// TestSourceRequests checks that the sessions of one source share one
// budget, that other sources have their own, and that a source's entry
// goes with its last session.
func TestSourceRequests(t *testing.T) {
	s := newSourceRequests(0.001, 2)
	a, b := netip.MustParsePrefix("192.0.2.1/32"), netip.MustParsePrefix("2001:db8::/64")
	a1, a2 := s.acquire(a), s.acquire(a)
	if !a1.Allow() || !a2.Allow() || a1.Allow() || a2.Allow() {
		t.Error("two sessions of one source: want one budget of 2 between them")
	}
	if bl := s.acquire(b); !bl.Allow() {
		t.Error("another source's session refused for the first source's budget")
	}
	s.release(a)
	if s.len() != 2 {
		t.Errorf("after one of a's two sessions closed: %d sources, want 2", s.len())
	}
	s.release(a)
	s.release(b)
	if s.len() != 0 {
		t.Errorf("after every session closed: %d sources, want 0", s.len())
	}
}
