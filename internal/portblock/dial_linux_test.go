// SPDX-License-Identifier: MIT

package portblock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestDialInBlock opens real TCP connections on loopback and checks that
// their source ports stay in the block and that the block's exhaustion
// fails fast, with the kernel option and with explicit binding. As root it
// runs in a network namespace of its own: in the host's, another test's
// listener on a port of the block makes that port unusable and the block
// smaller than the test expects.
func TestDialInBlock(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The thread stays in the new namespace and is discarded when
		// this goroutine exits locked.
		runtime.LockOSThread()
		if err := privateLoopback(); err != nil {
			t.Logf("own network namespace: %v; using the current one", err)
		}
		testDialInBlock(t)
	}()
	<-done
}

// privateLoopback moves the calling thread into a new network namespace
// with its loopback up. It needs CAP_SYS_ADMIN.
func privateLoopback() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}

func testDialInBlock(t *testing.T) {
	host, err := HostEphemeralRange()
	if err != nil {
		t.Error(err)
		return
	}
	lo := host.Lo + 1000
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Error(err)
		return
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	for i, explicit := range []bool{false, true} {
		// Separate blocks: closed connections leave their ports in
		// TIME_WAIT towards the listener.
		block := Range{lo + uint16(8*i), lo + uint16(8*i) + 3}
		d := &Dialer{Block: block, Base: net.Dialer{Timeout: 2 * time.Second}, Explicit: explicit}
		var conns []net.Conn
		for i := 0; i < block.Len(); i++ {
			c, err := d.DialContext(context.Background(), "tcp4", ln.Addr().String())
			if err != nil {
				t.Errorf("explicit=%v: dial %d: %v", explicit, i, err)
				return
			}
			conns = append(conns, c)
			p := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
			if !block.Contains(p) {
				t.Errorf("explicit=%v: source port %d outside block %v", explicit, p, block)
			}
		}
		t0 := time.Now()
		_, err := d.DialContext(context.Background(), "tcp4", ln.Addr().String())
		if !errors.Is(err, ErrExhausted) {
			t.Errorf("explicit=%v: dial beyond the block: got %v, want ErrExhausted", explicit, err)
		}
		if dt := time.Since(t0); dt > time.Second {
			t.Errorf("explicit=%v: exhaustion took %v, want immediate", explicit, dt)
		}
		for _, c := range conns {
			c.Close()
		}
	}
}

// TestDialExplicitOutsideRange: a block outside the host's ephemeral range
// works with explicit binding (the kernel would ignore IP_LOCAL_PORT_RANGE
// there), TCP and UDP; UDP flows never share a port, even towards one
// destination, and the block's exhaustion fails fast.
func TestDialExplicitOutsideRange(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		if err := privateLoopback(); err != nil {
			t.Logf("needs a private network namespace (root): %v; skipped", err)
			return
		}
		host, err := HostEphemeralRange()
		if err != nil {
			t.Error(err)
			return
		}
		block := Range{host.Lo - 100, host.Lo - 97} // 4 ports below the range
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Error(err)
			return
		}
		defer ln.Close()
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
			}
		}()
		pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
		if err != nil {
			t.Error(err)
			return
		}
		defer pc.Close()
		for _, tc := range []struct{ network, addr string }{{"tcp4", ln.Addr().String()}, {"udp4", pc.LocalAddr().String()}} {
			d := &Dialer{Block: block, Base: net.Dialer{Timeout: 2 * time.Second}, Explicit: true}
			seen := map[uint16]bool{}
			var conns []net.Conn
			for i := 0; i < block.Len(); i++ {
				c, err := d.DialContext(context.Background(), tc.network, tc.addr)
				if err != nil {
					t.Errorf("%s dial %d: %v", tc.network, i, err)
					return
				}
				conns = append(conns, c)
				p := netip.MustParseAddrPort(c.LocalAddr().String()).Port()
				if !block.Contains(p) || seen[p] {
					t.Errorf("%s: source port %d outside block %v or used twice", tc.network, p, block)
				}
				seen[p] = true
			}
			if _, err := d.DialContext(context.Background(), tc.network, tc.addr); !errors.Is(err, ErrExhausted) {
				t.Errorf("%s: dial beyond the block: got %v, want ErrExhausted", tc.network, err)
			}
			for _, c := range conns {
				c.Close()
			}
		}
	}()
	<-done
}

// BenchmarkDial measures one outgoing TCP connection from a 256-port block
// that already holds 128 open connections to the same destination: with
// the kernel's IP_LOCAL_PORT_RANGE (in the host's range) and with explicit
// binding (what a block outside the range costs). The listener closes
// first, so the dialler's ports do not linger in TIME_WAIT.
func BenchmarkDial(b *testing.B) {
	for _, explicit := range []bool{false, true} {
		name := map[bool]string{false: "range", true: "explicit"}[explicit]
		b.Run(name, func(b *testing.B) {
			done := make(chan struct{})
			go func() {
				defer close(done)
				runtime.LockOSThread()
				if err := privateLoopback(); err != nil {
					b.Logf("needs a private network namespace (root): %v; skipped", err)
					return
				}
				benchDial(b, explicit)
			}()
			<-done
		})
	}
}

func benchDial(b *testing.B, explicit bool) {
	host, err := HostEphemeralRange()
	if err != nil {
		b.Error(err)
		return
	}
	block := Range{host.Lo + 2000, host.Lo + 2255}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Error(err)
		return
	}
	defer ln.Close()
	hold := make(chan net.Conn, 256)
	go func() {
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if n < 128 {
				hold <- c // the first 128 stay open
				continue
			}
			c.Close()
		}
	}()
	d := &Dialer{Block: block, Base: net.Dialer{Timeout: 2 * time.Second}, Explicit: explicit}
	var held []net.Conn
	for i := 0; i < 128; i++ {
		c, err := d.DialContext(context.Background(), "tcp4", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		held = append(held, c)
	}
	buf := make([]byte, 1)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c, err := d.DialContext(context.Background(), "tcp4", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		c.Read(buf) // EOF once the listener closed its side
		c.Close()
	}
	b.StopTimer()
	for _, c := range held {
		c.Close()
	}
	close(hold)
	for c := range hold {
		c.Close()
	}
}
