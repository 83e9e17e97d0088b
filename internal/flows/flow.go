// SPDX-License-Identifier: MIT

// Package flows is the gateway's flow table: every flow a job opens (or
// that reaches it through an exposed port), with its 5-tuple, job, token,
// direction, bytes and packets each way, start, last activity, end and
// verdict, and the flow log that records each one as it ends.
//
// # Theory of operation
//
// An egress backend calls [Table.Open] when it admits a flow and
// [Flow.End] when the flow is over; in between it adds what it relays with
// [Flow.AddOut] and [Flow.AddIn] (user mode: per relayed chunk or
// datagram), or replaces the totals with [Flow.Set] (kernel mode: absolute
// conntrack counters read periodically). Those calls are atomic adds and
// stores on the Flow: they neither lock nor allocate, so they may sit on
// the data path. Each add also goes to the flow's job totals and to the
// gateway totals, so status and metrics see live traffic, not only ended
// flows.
//
// A flow the backend refuses (port block exhausted, flow limit, new-flow
// rate, and the policy's denials, see [Denied]) is reported with
// [Table.Refuse]: counted by verdict and logged, rate-limited.
//
// [Table.Run] ends flows idle for longer than their protocol's timeout,
// closing them through the backend's closer, and samples per-job rates.
// When a flow ends, its record goes to the [Log] (JSON lines, size-rotated)
// unless its outside address matches a bulk rule ([BulkRule]): bulk flows
// are only added to their rule's aggregate counters.
//
// Directions are the job's: "out" is what the job sent, "in" what it
// received, for egress and inbound (exposed-port) flows alike.
package flows

import (
	"io"
	"net/netip"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/jobs"
)

// Protocols of [Key.Proto].
const (
	ProtoICMP = ipproto.ICMP
	ProtoTCP  = ipproto.TCP
	ProtoUDP  = ipproto.UDP
)

// Flow directions.
const (
	// Egress flows are opened by the job towards the outside.
	Egress = "egress"
	// Inbound flows reach the job through one of its exposed ports.
	Inbound = "inbound"
)

// Verdicts. A refused flow's verdict starts with "refused:", a flow the
// policy denied has one made by [Denied].
const (
	Allowed        = "allowed"
	BlockExhausted = "refused:port-block-exhausted"
	FlowLimit      = "refused:flow-limit"
	NewFlowRate    = "refused:new-flow-rate"
)

// Denied returns the verdict of a flow denied by the policy rule named
// rule, e.g. "denied:block-smtp". The policy engine reports its denials to
// [Table.Refuse] with it.
func Denied(rule string) string {
	if rule == "" {
		rule = "default"
	}
	return "denied:" + rule
}

// End reasons of [Record.EndReason].
const (
	EndClosed  = "closed"   // both sides finished, or the backend saw it end
	EndIdle    = "idle"     // no traffic for the protocol's idle timeout
	EndJob     = "job-left" // the job's lease ended
	EndStopped = "gateway-stopped"
)

// Key is a flow's 5-tuple as the job sees it. For an egress flow Src is the
// job's address and port, Dst the outside destination; for an inbound flow
// Src is the outside peer and Dst the job's address and (job-side) port.
// ICMP echo flows carry the echo id as Src's port and 0 as Dst's.
type Key struct {
	Proto ipproto.Proto
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

// Flow is one tracked flow. Its counters may be updated from any goroutine
// without locks; the zero value is not usable, get one from [Table.Open].
type Flow struct {
	id  uint64
	t   *Table
	key Key
	// job is the flow's job ("" for an address of no known job), ref
	// and public what records say of it, jaddr its (first) tunnel
	// address.
	job    jobs.ID
	ref    jobs.Ref
	public netip.Addr
	jaddr  netip.Addr
	dir    string
	start  time.Time
	bulk   int       // index into t.bulk, -1 for none
	jt     *counters // the job's totals, nil for an unknown job

	bytesOut, bytesIn, pktsOut, pktsIn atomic.Uint64
	lastSeen                           atomic.Int64 // unix nanoseconds
	// publicPort is the source port the outside sees (SetPublicPort).
	publicPort atomic.Uint32
	ended      atomic.Bool

	// closer, if set, ends the flow in the backend (idle timeout).
	closer io.Closer
	// packets, if set, reports packet counts the backend keeps elsewhere
	// (user-mode TCP: the netstack endpoint's segment counters); it then
	// overrides pktsOut and pktsIn.
	packets func() (out, in uint64)
}

// ID returns the flow's id, unique within the table's lifetime.
func (f *Flow) ID() uint64 { return f.id }

// Key returns the flow's 5-tuple.
func (f *Flow) Key() Key { return f.key }

// SetCloser sets what ends the flow in the backend when the table times it
// out; Close must be safe to call concurrently with the flow's relay and
// more than once. On nil it does nothing.
func (f *Flow) SetCloser(c io.Closer) {
	if f != nil {
		f.closer = c
	}
}

// SetPublicPort records the source port the outside sees the flow come
// from: the port of the job's block the gateway dialled from (user mode)
// or source-NATed to (kernel mode). Safe to call while the flow is read;
// on nil, or with port 0, it does nothing.
func (f *Flow) SetPublicPort(port uint16) {
	if f != nil && port != 0 {
		f.publicPort.Store(uint32(port))
	}
}

// SetPacketCounter makes the flow take its packet counts from fn, called
// when the flow is read (snapshots, end), never on the data path. It must
// be set before the flow carries traffic. On nil it does nothing.
func (f *Flow) SetPacketCounter(fn func() (out, in uint64)) {
	if f != nil {
		f.packets = fn
	}
}

// AddOut counts n bytes in pkts packets sent by the job. It does not
// allocate or lock.
func (f *Flow) AddOut(n, pkts uint64) {
	if f == nil {
		return
	}
	f.bytesOut.Add(n)
	f.pktsOut.Add(pkts)
	f.jt.addOut(n, pkts)
	f.t.totals.addOut(n, pkts)
	f.lastSeen.Store(time.Now().UnixNano())
}

// AddIn counts n bytes in pkts packets received by the job.
func (f *Flow) AddIn(n, pkts uint64) {
	if f == nil {
		return
	}
	f.bytesIn.Add(n)
	f.pktsIn.Add(pkts)
	f.jt.addIn(n, pkts)
	f.t.totals.addIn(n, pkts)
	f.lastSeen.Store(time.Now().UnixNano())
}

// Set replaces the flow's counters with absolute values (kernel mode:
// conntrack's), adding the differences to the job and gateway totals.
// Counters never go backwards; smaller values are ignored. lastSeen moves
// only when a counter grew. It must not be mixed with AddOut/AddIn on one
// flow, and calls must not run concurrently for one flow.
func (f *Flow) Set(bytesOut, pktsOut, bytesIn, pktsIn uint64) {
	if f == nil {
		return
	}
	dbo := sub(bytesOut, f.bytesOut.Load())
	dpo := sub(pktsOut, f.pktsOut.Load())
	dbi := sub(bytesIn, f.bytesIn.Load())
	dpi := sub(pktsIn, f.pktsIn.Load())
	if dbo|dpo|dbi|dpi == 0 {
		return
	}
	f.bytesOut.Add(dbo)
	f.pktsOut.Add(dpo)
	f.bytesIn.Add(dbi)
	f.pktsIn.Add(dpi)
	f.jt.addOut(dbo, dpo)
	f.jt.addIn(dbi, dpi)
	f.t.totals.addOut(dbo, dpo)
	f.t.totals.addIn(dbi, dpi)
	f.lastSeen.Store(time.Now().UnixNano())
}

func sub(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

// End ends the flow for reason (EndClosed, ...): it leaves the active
// table, and its record goes to the flow log (or its bulk rule's
// aggregate). Only the first call counts; End on nil does nothing.
func (f *Flow) End(reason string) {
	if f == nil || !f.ended.CompareAndSwap(false, true) {
		return
	}
	f.t.end(f, reason, time.Now())
}

// Ended reports whether End was called.
func (f *Flow) Ended() bool { return f.ended.Load() }

// counts returns the flow's packet and byte counters.
func (f *Flow) counts() (bo, bi, po, pi uint64) {
	bo, bi = f.bytesOut.Load(), f.bytesIn.Load()
	po, pi = f.pktsOut.Load(), f.pktsIn.Load()
	if f.packets != nil {
		po, pi = f.packets()
	}
	return
}

// Record is a flow as the flow log, `airlock flows` and the admin API show
// it.
type Record struct {
	ID    uint64 `json:"id"`
	Proto string `json:"proto"`
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	// Direction is Egress or Inbound.
	Direction string `json:"direction"`
	// JobAddr is the job's (first) tunnel address, whichever family the
	// flow is of.
	JobAddr string `json:"job_addr,omitempty"`
	// Lease is the job's ID, its lease id ("" for an address of no known
	// job).
	Lease jobs.ID `json:"lease"`
	jobs.Ref
	// PublicAddr is the gateway's egress address the job's flows of the
	// flow's address family leave from (and its exposed ports listen
	// on); with the job's port block in the lease history it attributes
	// what the outside saw.
	PublicAddr netip.Addr `json:"public_addr,omitzero"`
	// PublicPort is the egress flow's source port as the outside saw it
	// (public_addr:public_port), 0 where unknown (inbound flows, ICMP).
	PublicPort uint16    `json:"public_port,omitzero"`
	Verdict    string    `json:"verdict"`
	BytesOut   uint64    `json:"bytes_out"`
	BytesIn    uint64    `json:"bytes_in"`
	PacketsOut uint64    `json:"packets_out"`
	PacketsIn  uint64    `json:"packets_in"`
	Start      time.Time `json:"start"`
	LastSeen   time.Time `json:"last_seen,omitzero"`
	// End is zero while the flow is active.
	End       time.Time `json:"end,omitzero"`
	EndReason string    `json:"end_reason,omitempty"`
	// Bulk names the bulk rule the flow matched, if any.
	Bulk string `json:"bulk,omitempty"`
	// Bypass, on a Bypassed row, names the bypass entry; Flows is how
	// many flows the row aggregates.
	Bypass string `json:"bypass,omitempty"`
	Flows  uint64 `json:"flows,omitempty"`
	// Suppressed, on a refused flow's or a DNS query's record, is how
	// many records of the same kind of this job were not logged since its
	// previous logged one (rate limit).
	Suppressed uint64 `json:"suppressed,omitempty"`
	// DNS, on a DNS query's record, is the query and its answer.
	DNS *DNSInfo `json:"dns,omitempty"`
}

// record builds f's Record; end is zero for an active flow.
func (f *Flow) record(end time.Time, reason string) Record {
	bo, bi, po, pi := f.counts()
	r := Record{
		ID: f.id, Proto: f.key.Proto.String(), Src: f.key.Src.String(), Dst: f.key.Dst.String(),
		Direction: f.dir, JobAddr: addrString(f.jaddr), Lease: f.job, Ref: f.ref, PublicAddr: f.public, Verdict: Allowed,
		BytesOut: bo, BytesIn: bi, PacketsOut: po, PacketsIn: pi,
		Start: f.start, End: end, EndReason: reason, PublicPort: uint16(f.publicPort.Load()),
	}
	if ls := f.lastSeen.Load(); ls != 0 {
		r.LastSeen = time.Unix(0, ls)
	}
	if f.bulk >= 0 {
		r.Bulk = f.t.bulk[f.bulk].Name
	}
	return r
}

// Counters returns the flow's bytes and packets so far, each way.
func (f *Flow) Counters() (bytesOut, bytesIn, pktsOut, pktsIn uint64) { return f.counts() }

// addrString formats a for a record: "" for the zero Addr.
func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
