// SPDX-License-Identifier: MIT

package gateway

import (
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/gateway/bypassconf"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

var _ control.Backend = (*gateway)(nil)

// bypassNotice tells lease watches that the config's bypass may have
// changed: the channel is closed, and replaced, at every reload. It is
// safe for concurrent use; the zero value is ready.
type bypassNotice struct {
	mu sync.Mutex
	ch chan struct{} // guarded by mu
}

// wait returns the channel the next change closes.
func (n *bypassNotice) wait() <-chan struct{} {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch == nil {
		n.ch = make(chan struct{})
	}
	return n.ch
}

// changed wakes every watch.
func (n *bypassNotice) changed() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ch != nil {
		close(n.ch)
	}
	n.ch = make(chan struct{})
}

// jobBypass is the bypass a job of token tok gets from the config in
// force (nil: none).
func (g *gateway) jobBypass(tok string) *control.Bypass {
	c := g.conf.Load()
	return bypassconf.ForJob(c.Bypass, c.Policy, tok)
}

// LeaseBypass implements control.Backend.
func (g *gateway) LeaseBypass(ref control.LeaseRef) (*control.Bypass, <-chan struct{}, error) {
	ch := g.bypassNotice.wait()
	l, err := g.leases.Check(ref.ID, ref.Secret, time.Now())
	if err != nil {
		return nil, nil, g.admin.leaseGone(ref.ID, err)
	}
	o := l.Owner
	return g.jobBypass(o.Token), ch, nil
}

// ReportBypass implements control.Backend: the counts of entries
// the job's token has in the config in force go to the flow table
// (status, metrics, flow log rows marked bypass); others are ignored, so
// a client cannot invent entries.
func (g *gateway) ReportBypass(ref control.LeaseRef, counts []control.BypassCount) {
	l, err := g.leases.Check(ref.ID, ref.Secret, time.Now())
	if err != nil || g.flows == nil {
		return
	}
	o := l.Owner
	b := g.jobBypass(o.Token)
	if b == nil {
		return
	}
	to := make(map[string]string, len(b.Rules))
	for _, r := range b.Rules {
		to[r.Name] = prefixList(r.To)
	}
	var in []flows.BypassStats
	for _, c := range counts {
		if _, ok := to[c.Rule]; ok {
			in = append(in, flows.BypassStats{Rule: c.Rule, Flows: c.Flows, BytesOut: c.BytesOut, BytesIn: c.BytesIn})
		}
	}
	g.flows.ReportBypass(jobs.ID(l.ID), in, func(rule string) string { return to[rule] })
}

func prefixList(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}
