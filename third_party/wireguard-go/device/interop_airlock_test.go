// SPDX-License-Identifier: MIT

package device_test

import (
	"crypto/ecdh"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn/bindtest"
	upstream "golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"

	patched "github.com/airlock-vpn/airlock/third_party/wireguard-go/device"
)

// wgDevice is what both device packages offer.
type wgDevice interface {
	IpcSet(string) error
	Up() error
	Close()
}

// TestInteropWithUpstream runs Airlock's patched device against
// wireguard-go's own, over channel binds, in both roles: each side starts
// handshakes (the patch changes how X25519 is computed) and a packet
// crosses in each direction.
func TestInteropWithUpstream(t *testing.T) {
	for _, patchedInitiates := range []bool{true, false} {
		t.Run(fmt.Sprintf("patched_initiates=%v", patchedInitiates), func(t *testing.T) {
			var keys [2]*ecdh.PrivateKey
			for i := range keys {
				k, err := ecdh.X25519().GenerateKey(rand.Reader)
				if err != nil {
					t.Fatal(err)
				}
				keys[i] = k
			}
			binds := bindtest.NewChannelBinds()
			tuns := [2]*tuntest.ChannelTUN{tuntest.NewChannelTUN(), tuntest.NewChannelTUN()}
			devs := [2]wgDevice{
				patched.NewDevice(tuns[0].TUN(), binds[0], patched.NewLogger(patched.LogLevelError, "patched: ")),
				upstream.NewDevice(tuns[1].TUN(), binds[1], upstream.NewLogger(upstream.LogLevelError, "upstream: ")),
			}
			ips := [2]netip.Addr{netip.MustParseAddr("1.0.0.1"), netip.MustParseAddr("1.0.0.2")}
			for i, d := range devs {
				defer d.Close()
				peer := keys[i^1].PublicKey().Bytes()
				cfg := fmt.Sprintf("private_key=%s\nlisten_port=%d\npublic_key=%s\nallowed_ip=%s/32\nendpoint=127.0.0.1:%d\n",
					hex.EncodeToString(keys[i].Bytes()), 0, hex.EncodeToString(peer), ips[i^1], i+1) // bindtest: bind i sends to endpoint i+1
				if err := d.IpcSet(cfg); err != nil {
					t.Fatalf("configure device %d: %v", i, err)
				}
				if err := d.Up(); err != nil {
					t.Fatalf("up device %d: %v", i, err)
				}
			}
			from := 1
			if patchedInitiates {
				from = 0
			}
			for _, src := range []int{from, from ^ 1} {
				msg := tuntest.Ping(ips[src^1], ips[src])
				tuns[src].Outbound <- msg
				select {
				case got := <-tuns[src^1].Inbound:
					if string(got) != string(msg) {
						t.Fatalf("device %d received %x, want %x", src^1, got, msg)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("no packet from device %d to %d within 5 s: no handshake", src, src^1)
				}
			}
		})
	}
}
