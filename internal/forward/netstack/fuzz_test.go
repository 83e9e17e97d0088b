// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"

	"github.com/airlock-vpn/airlock/internal/policy"
)

// FuzzWrite feeds arbitrary bytes to Stack.Write, as a job can: it must not
// panic, must not fail, and must never make the gateway dial a denied
// destination.
func FuzzWrite(f *testing.F) {
	job := netip.AddrPortFrom(jobAddr, 40000)
	f.Add(rawPacket(6, job, netip.MustParseAddrPort("198.51.100.7:80"), nil))
	f.Add(rawPacket(6, job, netip.MustParseAddrPort("127.0.0.1:80"), nil))
	f.Add(rawPacket(17, job, netip.MustParseAddrPort("100.64.0.1:53"), []byte("\x00\x01\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x01a\x00\x00\x01\x00\x01")))
	f.Add(rawPacket(17, job, netip.MustParseAddrPort("198.51.100.7:7"), []byte("x")))
	f.Add(rawPacket(6, netip.MustParseAddrPort("[fd00::2]:1"), netip.MustParseAddrPort("[2001:db8::1]:80"), nil))
	f.Add(rawPacket(6, netip.MustParseAddrPort("[fd00::2]:1"), netip.MustParseAddrPort("[64:ff9b::a9fe:a9fe]:80"), nil))
	f.Add([]byte{0x45})
	f.Add([]byte{0x60, 0, 0, 0, 0, 0, 58, 64})
	f.Add([]byte{})

	denied := make(chan string, 1)
	dial := func(ctx context.Context, network, address string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(address)
		if err != nil || (&policy.Policy{}).Decide(policy.Flow{Proto: policy.ProtoTCP, Dst: ap.Addr(), Port: ap.Port(), Tunnels: []netip.Prefix{gwPrefix.Masked()}}).Action != policy.Allow {
			select {
			case denied <- address:
			default:
			}
		}
		return nil, errors.New("fuzz: no dialing")
	}
	s, err := New(Config{Logger: testLogger(), Addrs: []netip.Prefix{gwPrefix}, Dial: dial,
		DNSUpstreams: []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { s.Close() })
	go func() { // drain replies so the queue never fills
		bufs := [][]byte{make([]byte, 65536)}
		for {
			if _, err := s.Read(bufs, []int{0}, 0); err != nil {
				return
			}
		}
	}()

	f.Fuzz(func(t *testing.T, b []byte) {
		for _, off := range []int{0, 4} {
			buf := append(make([]byte, off), b...)
			n, err := s.Write([][]byte{buf}, off)
			if err != nil || n != 1 {
				t.Fatalf("Write: got %d, %v, want 1, nil", n, err)
			}
		}
		select {
		case a := <-denied:
			t.Fatalf("dialled denied destination %s", a)
		default:
		}
	})
}
