// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// PeerState is what the gateway's device knows of one peer.
type PeerState struct {
	// LastHandshake is when its last handshake completed (zero: none);
	// wireguard-go records the time itself, so the value does not depend
	// on when it is asked.
	LastHandshake time.Time
	// Endpoint is its UDP address as last authenticated; zero for a
	// peer reached over a stream (the TCP transport) or not heard yet.
	Endpoint netip.AddrPort
}

// Peers returns the state of every peer. It reads the device's whole
// configuration: call it at most a few times a second.
func (g *Gateway) Peers() (map[wgkey.Key]PeerState, error) {
	s, err := g.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("read wireguard peers: %w", err)
	}
	ps := parsePeers(s)
	// Each peer counts behind the address it was last heard from.
	for k, p := range ps {
		if p.Endpoint.IsValid() {
			g.budget.move(k, p.Endpoint.Addr())
		}
	}
	return ps, nil
}

// Handshakes returns, for every peer that has completed a handshake, when
// its last one completed (see Peers).
func (g *Gateway) Handshakes() (map[wgkey.Key]time.Time, error) {
	ps, err := g.Peers()
	if err != nil {
		return nil, err
	}
	out := make(map[wgkey.Key]time.Time, len(ps))
	for k, p := range ps {
		if !p.LastHandshake.IsZero() {
			out[k] = p.LastHandshake
		}
	}
	return out, nil
}

// parsePeers reads the peers from a UAPI "get" answer: public_key=HEX
// starts a peer; endpoint, last_handshake_time_sec and _nsec follow it.
func parsePeers(s string) map[wgkey.Key]PeerState {
	out := map[wgkey.Key]PeerState{}
	var cur wgkey.Key
	var have bool
	var st PeerState
	var sec, nsec int64
	flush := func() {
		if !have {
			return
		}
		if sec != 0 || nsec != 0 {
			st.LastHandshake = time.Unix(sec, nsec)
		}
		out[cur] = st
	}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "public_key":
			flush()
			have, st, sec, nsec = false, PeerState{}, 0, 0
			b, err := hex.DecodeString(v)
			if err == nil && len(b) == len(cur) {
				copy(cur[:], b)
				have = true
			}
		case "endpoint":
			if ap, err := netip.ParseAddrPort(v); err == nil {
				st.Endpoint = netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
			}
		case "last_handshake_time_sec":
			sec, _ = strconv.ParseInt(v, 10, 64)
		case "last_handshake_time_nsec":
			nsec, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	flush()
	return out
}
