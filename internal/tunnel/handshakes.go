// SPDX-License-Identifier: MIT

package tunnel

import (
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Handshakes returns, for every peer that has completed a handshake, when
// its last one completed (wireguard-go records the time itself, so the
// value does not depend on when it is asked). It reads the device's whole
// configuration: call it at most a few times a second.
func (g *Gateway) Handshakes() (map[wgkey.Key]time.Time, error) {
	s, err := g.dev.IpcGet()
	if err != nil {
		return nil, fmt.Errorf("read wireguard peers: %w", err)
	}
	return parseHandshakes(s), nil
}

// parseHandshakes reads the peers' last handshake times from a UAPI "get"
// answer: public_key=HEX starts a peer, last_handshake_time_sec and _nsec
// follow it.
func parseHandshakes(s string) map[wgkey.Key]time.Time {
	out := map[wgkey.Key]time.Time{}
	var cur wgkey.Key
	var have bool
	var sec, nsec int64
	flush := func() {
		if have && (sec != 0 || nsec != 0) {
			out[cur] = time.Unix(sec, nsec)
		}
	}
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		switch k {
		case "public_key":
			flush()
			have, sec, nsec = false, 0, 0
			b, err := hex.DecodeString(v)
			if err == nil && len(b) == len(cur) {
				copy(cur[:], b)
				have = true
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
