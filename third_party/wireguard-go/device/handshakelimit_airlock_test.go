/* SPDX-License-Identifier: MIT
 *
 * Airlock's patch: the test of SetHandshakeLimiter (handshakelimit.go).
 */

package device

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/tun/tuntest"
)

// countingLimiter allows or refuses every handshake and counts the asks.
type countingLimiter struct {
	allow bool
	asked atomic.Int64
}

func (l *countingLimiter) Allow(netip.Addr) bool {
	l.asked.Add(1)
	return l.allow
}

// TestHandshakeLimiterUnderLoad: under load, jobs behind one address pass
// the cookie round and then the limiter the device was given, not
// upstream's 20 a second: 40 jobs on 127.0.0.1 all complete their
// handshake at their first retry when it allows them, and none does
// when it refuses them.
func TestHandshakeLimiterUnderLoad(t *testing.T) {
	for _, allow := range []bool{true, false} {
		t.Run(fmt.Sprintf("allow=%v", allow), func(t *testing.T) {
			const jobs = 40
			gwKey, gwPub := testKeyPair(t)
			gw := NewDevice(tuntest.NewChannelTUN().TUN(), conn.NewDefaultBind(), NewLogger(LogLevelError, "gw: "))
			t.Cleanup(gw.Close)
			lim := &countingLimiter{allow: allow}
			gw.SetHandshakeLimiter(lim)
			if err := gw.IpcSet(uapiCfg("private_key", hex.EncodeToString(gwKey[:]), "listen_port", "0")); err != nil {
				t.Fatal(err)
			}
			if err := gw.Up(); err != nil {
				t.Fatal(err)
			}
			gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())
			gwAddr := fmt.Sprintf("127.0.0.1:%d", gw.net.port)
			var peers []*Peer
			for i := range jobs {
				key, pub := testKeyPair(t)
				dev := NewDevice(tuntest.NewChannelTUN().TUN(), conn.NewDefaultBind(), NewLogger(LogLevelError, ""))
				t.Cleanup(dev.Close)
				if err := dev.IpcSet(uapiCfg("private_key", hex.EncodeToString(key[:]), "listen_port", "0",
					"public_key", hex.EncodeToString(gwPub[:]), "allowed_ip", "10.9.255.254/32", "endpoint", gwAddr)); err != nil {
					t.Fatal(err)
				}
				if err := dev.Up(); err != nil {
					t.Fatal(err)
				}
				if err := gw.IpcSet(uapiCfg("public_key", hex.EncodeToString(pub[:]),
					"allowed_ip", netip.AddrFrom4([4]byte{10, 9, 1, byte(i + 1)}).String()+"/32")); err != nil {
					t.Fatal(err)
				}
				jp := dev.LookupPeer(gwPub)
				if err := jp.SendHandshakeInitiation(false); err != nil {
					t.Fatal(err)
				}
				peers = append(peers, jp)
			}
			// The first initiation gets a cookie; the retry (5 s and
			// up to 1/3 s of jitter) carries it.
			deadline := time.Now().Add(8 * time.Second)
			done := 0
			for time.Now().Before(deadline) {
				done = 0
				for _, p := range peers {
					if p.lastHandshakeNano.Load() != 0 {
						done++
					}
				}
				if done == jobs || (!allow && lim.asked.Load() >= jobs) {
					break
				}
				gw.rate.underLoadUntil.Store(time.Now().Add(time.Hour).UnixNano())
				time.Sleep(50 * time.Millisecond)
			}
			if lim.asked.Load() == 0 {
				t.Fatal("the device under load never asked its handshake limiter")
			}
			if allow && done != jobs {
				t.Errorf("%d of %d jobs behind one address completed their handshake within 8 s under load with a limiter that allows them", done, jobs)
			}
			if !allow && done != 0 {
				t.Errorf("%d jobs completed their handshake under load although the limiter refused every one", done)
			}
			t.Logf("allow=%v: %d of %d handshakes, limiter asked %d times", allow, done, jobs, lim.asked.Load())
		})
	}
}
