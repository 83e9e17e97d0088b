// SPDX-License-Identifier: MIT

package control

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/ipproto"
)

// ParsePort parses PORT, PORT/tcp or PORT/udp (protocol case-insensitive,
// default tcp), the syntax of `airlock run --expose`. PORT is 1-65535.
func ParsePort(spec string) (Port, error) {
	s := strings.TrimSpace(spec)
	num, proto, hasProto := strings.Cut(s, "/")
	p := Port{Proto: ProtoTCP}
	if hasProto {
		var err error
		p.Proto, err = ipproto.Parse(strings.ToLower(proto))
		if err != nil || proto == "" {
			p.Proto = ipproto.Any
		}
	}
	if p.Proto != ProtoTCP && p.Proto != ProtoUDP {
		return Port{}, fmt.Errorf("port %q: protocol %q: want tcp or udp (e.g. 8080/udp)", spec, proto)
	}
	n, err := strconv.ParseUint(num, 10, 16)
	if err != nil || n == 0 {
		return Port{}, fmt.Errorf("port %q: want PORT[/tcp|/udp] with PORT 1-65535", spec)
	}
	p.Port = uint16(n)
	return p, nil
}

// String returns PORT/PROTO, e.g. "8080/tcp".
func (p Port) String() string { return strconv.Itoa(int(p.Port)) + "/" + p.Proto.String() }

// Validate checks that p is a port ParsePort could have returned.
func (p Port) Validate() error {
	if p.Proto != ProtoTCP && p.Proto != ProtoUDP {
		return fmt.Errorf("port %d: protocol %q: want tcp or udp", p.Port, p.Proto)
	}
	if p.Port == 0 {
		return fmt.Errorf("port 0/%s: want 1-65535", p.Proto)
	}
	return nil
}
