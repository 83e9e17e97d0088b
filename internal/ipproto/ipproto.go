// SPDX-License-Identifier: MIT

// Package ipproto is Airlock's one protocol type: the transport protocol
// of a flow, a policy rule, a bypass entry or an exposed port, by its IANA
// protocol number, written "tcp", "udp" or "icmp" for people, in config
// files and in the control protocol's JSON.
package ipproto

import (
	"fmt"
	"strconv"
)

// Proto is a transport protocol by its IANA number. The zero value, Any,
// means every protocol; it appears only in rules. A Proto is a value, safe
// to copy and compare.
type Proto uint8

// The protocols Airlock carries.
const (
	Any  Proto = 0
	ICMP Proto = 1 // ICMP and ICMPv6 (echo)
	TCP  Proto = 6
	UDP  Proto = 17
)

// String returns "tcp", "udp", "icmp", "any", or the number of another
// protocol.
func (p Proto) String() string {
	switch p {
	case Any:
		return "any"
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	case ICMP:
		return "icmp"
	}
	return strconv.Itoa(int(p))
}

// Parse parses "tcp", "udp", "icmp" or "any" ("" is any).
func Parse(s string) (Proto, error) {
	switch s {
	case "tcp":
		return TCP, nil
	case "udp":
		return UDP, nil
	case "icmp":
		return ICMP, nil
	case "any", "":
		return Any, nil
	}
	return Any, fmt.Errorf("protocol %q: want tcp, udp, icmp or any", s)
}

// MarshalText returns the protocol's name as String does, but "" for Any,
// so that a JSON field with omitempty leaves out "every protocol".
func (p Proto) MarshalText() ([]byte, error) {
	if p == Any {
		return []byte{}, nil
	}
	return []byte(p.String()), nil
}

// UnmarshalText parses a name as Parse does.
func (p *Proto) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}
