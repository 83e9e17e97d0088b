// SPDX-License-Identifier: MIT

package policy

import (
	"fmt"

	"github.com/airlock-vpn/airlock/internal/portblock"
)

// ExposeRule allows jobs of some tokens to expose some of their ports
// (`airlock run --expose`). Empty Tokens means every token; ProtoAny means
// TCP and UDP; empty Ports means every port.
type ExposeRule struct {
	Tokens []string
	Proto  Proto
	Ports  []portblock.Range
}

// Exposure is the list of ExposeRules; a job may expose a port if any rule
// allows it. A nil *Exposure allows everything (a gateway without a config
// file); an empty one nothing.
type Exposure struct {
	Rules []ExposeRule
}

// Validate checks the rules' protocols and port ranges.
func (e *Exposure) Validate() error {
	if e == nil {
		return nil
	}
	for i, r := range e.Rules {
		if r.Proto != ProtoAny && r.Proto != ProtoTCP && r.Proto != ProtoUDP {
			return fmt.Errorf("expose rule %d: protocol %s: want tcp, udp or any", i+1, r.Proto)
		}
		for _, pr := range r.Ports {
			if pr.Lo == 0 || pr.Lo > pr.Hi {
				return fmt.Errorf("expose rule %d: port range %d-%d: want 1 <= LO <= HI <= 65535", i+1, pr.Lo, pr.Hi)
			}
		}
	}
	return nil
}

// Allowed reports whether a job of token may expose port of proto (tcp or
// udp).
func (e *Exposure) Allowed(token string, proto Proto, port uint16) bool {
	if e == nil {
		return true
	}
	for i := range e.Rules {
		r := &e.Rules[i]
		if r.Proto != ProtoAny && r.Proto != proto {
			continue
		}
		rule := Rule{Tokens: r.Tokens, Ports: r.Ports}
		if rule.matchesFlow(Flow{Token: token, Proto: proto, Port: port}) {
			return true
		}
	}
	return false
}
