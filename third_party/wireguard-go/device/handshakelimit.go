/* SPDX-License-Identifier: MIT
 *
 * Airlock's patch: the per-source limit on handshakes under load can be
 * replaced by the device's user.
 */

package device

import "net/netip"

// HandshakeLimiter decides, while the device is under load, whether a
// handshake message from source ip that passed the cookie round (so ip is
// not spoofed) is processed. Upstream admits 20 a second per address,
// bursts of 5 (package ratelimiter); a gateway whose jobs share one
// compute node's address needs a budget that grows with the peers behind
// that address (internal/tunnel). It must be safe for concurrent use.
type HandshakeLimiter interface {
	Allow(ip netip.Addr) bool
}

// SetHandshakeLimiter replaces upstream's per-source limit by l (nil:
// upstream's again).
func (device *Device) SetHandshakeLimiter(l HandshakeLimiter) {
	if l == nil {
		device.rate.custom.Store(nil)
		return
	}
	device.rate.custom.Store(&l)
}

// allowHandshake applies the per-source limit to a handshake message from
// ip under load.
func (device *Device) allowHandshake(ip netip.Addr) bool {
	if l := device.rate.custom.Load(); l != nil {
		return (*l).Allow(ip)
	}
	return device.rate.limiter.Allow(ip)
}
