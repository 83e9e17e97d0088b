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
