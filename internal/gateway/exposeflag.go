// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"strings"

	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
)

// ParseExposePorts parses --expose-ports: the job ports that jobs of every
// token may expose on a gateway without a config file, as comma-separated
// PORT[-PORT][/tcp|/udp] (no protocol: both). "" allows none, which is the
// default: a job exposes nothing the admin did not name. The result goes
// to Config.ExposePorts.
func ParseExposePorts(s string) (*policy.Exposure, error) {
	ex := &policy.Exposure{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ports, proto, _ := strings.Cut(f, "/")
		p := policy.ProtoAny
		switch proto {
		case "":
		case "tcp":
			p = policy.ProtoTCP
		case "udp":
			p = policy.ProtoUDP
		default:
			return nil, fmt.Errorf("bad --expose-ports %q: protocol %q: want tcp or udp", f, proto)
		}
		if !strings.Contains(ports, "-") {
			ports += "-" + ports
		}
		r, err := portblock.ParseRange(ports)
		if err != nil {
			return nil, fmt.Errorf("bad --expose-ports %q: want PORT[-PORT][/tcp|/udp]: %w", f, err)
		}
		ex.Rules = append(ex.Rules, policy.ExposeRule{Proto: p, Ports: []portblock.Range{{Lo: r.Lo, Hi: r.Hi}}})
	}
	return ex, nil
}
