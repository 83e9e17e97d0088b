// SPDX-License-Identifier: MIT

package store

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"sort"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	bolt "go.etcd.io/bbolt"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// Buckets of the attribution history.
var (
	// bucketLeases maps lease id → JSON LeaseRecord.
	bucketLeases = []byte("leases")
	// bucketAttribution indexes leases by where they were seen outside:
	// public address (16 bytes) | first port (2) | start (8, unix ns) |
	// lease id → nothing. Sorted so that a port's candidates are the keys
	// just below addr|port.
	bucketAttribution = []byte("attribution")
	// bucketMeta holds single values, e.g. metaMaxSpan.
	bucketMeta = []byte("meta")
	// metaMaxSpan is the widest port block ever recorded (uint16): how far
	// below a port Whois must look.
	metaMaxSpan = []byte("max_block_span")
)

// LeaseRecord is one lease in the attribution history: who held which
// tunnel address and which ports of which public address, and when.
type LeaseRecord struct {
	ID string `json:"id"`
	// JobID, BatchSystem, User, UID, Host and Command are what the job's
	// client claimed; Attested, if set, is what a trusted party vouched
	// for (attest.go).
	JobID       string `json:"job_id,omitempty"`
	BatchSystem string `json:"batch_system,omitempty"`
	User        string `json:"user,omitempty"`
	UID         int    `json:"uid"`
	Host        string `json:"host,omitempty"`
	Command     string `json:"command,omitempty"`
	// Attested is the job's attested identity, nil if it had none.
	Attested *identity.Attestation `json:"attested,omitempty"`
	// Issued is the job's identity from its issuer-verified bearer
	// token, nil if it had none.
	Issued *identity.Issued `json:"issued,omitempty"`
	// Token is the name of the join token, "" for a join without one
	// (attested).
	Token string `json:"token,omitempty"`
	// Remote is the client's address as the gateway saw it.
	Remote string `json:"remote,omitempty"`
	// Gateway is the advertised address (HOST:PORT) of the gateway that
	// held the lease; empty in records of a gateway older than fleets.
	Gateway string `json:"gateway,omitempty"`
	// TunnelAddrs are the job's addresses inside the tunnel: first the
	// one its lease allocated, then (dual stack) its IPv6 one.
	TunnelAddrs []netip.Addr `json:"tunnel_addrs"`
	// Egress lists where the job's flows left from, at most one entry per
	// address family (Attributions): a public address with the job's
	// port block, or (Own) the job's own address with any port. An
	// unspecified address stands for every address of the gateway host
	// of its family. Empty when the lease had no port block.
	Egress []Attribution `json:"egress,omitempty"`
	// Exposed lists the job's inbound mappings as PROTO/PORT=IP:PUBPORT,
	// e.g. "tcp/8080=203.0.113.1:33023" (airlock run --expose).
	Exposed []string  `json:"exposed,omitempty"`
	Start   time.Time `json:"start"`
	// End is when the lease ended; zero while it is active.
	End time.Time `json:"end,omitzero"`
	// EndReason says how it ended: released, expired, replaced, kicked,
	// gateway restarted (a live lease a restart could not restore).
	EndReason string `json:"end_reason,omitempty"`
	// Resume holds what a restarted gateway needs to take a live lease
	// back; it is dropped when the lease ends.
	Resume *ResumeState `json:"resume,omitempty"`
}

// ResumeState is the part of a live lease that is not history: enough for
// a gateway that restarts to restore the lease, so that its client keeps
// its tunnel address, port block and exposed ports.
type ResumeState struct {
	// SecretHash is the SHA-256 of the lease secret.
	SecretHash []byte `json:"secret_hash"`
	// PublicKey is the job's WireGuard public key, base64.
	PublicKey string `json:"public_key"`
	// Block is the index of the job's port block, -1 for none.
	Block int `json:"block"`
	// Blocks is how many port blocks the job holds from Block on
	// (internal/lease runs); 0 means 1.
	Blocks int `json:"blocks,omitempty"`
	// Expose is the join's expose request, as PROTO/PORT.
	Expose []string `json:"expose,omitempty"`
}

// Active reports whether r covers time at.
func (r LeaseRecord) covers(at time.Time) bool {
	return !at.Before(r.Start) && (r.End.IsZero() || at.Before(r.End))
}

// TunnelAddr returns the job's first tunnel address (the zero Addr for a
// record without one).
func (r LeaseRecord) TunnelAddr() netip.Addr {
	if len(r.TunnelAddrs) == 0 {
		return netip.Addr{}
	}
	return r.TunnelAddrs[0]
}

// AttributionAt returns the attribution of r that names addr (an
// unspecified one of addr's family names every address of it); else its
// first, and false if it has none.
func (r LeaseRecord) AttributionAt(addr netip.Addr) (Attribution, bool) {
	as := Attributions(r)
	for _, a := range as {
		if a.Addr == addr.Unmap() || a.Addr.IsUnspecified() && a.Addr.Is4() == addr.Unmap().Is4() {
			return a, true
		}
	}
	if len(as) > 0 {
		return as[0], true
	}
	return Attribution{}, false
}

// seenAt reports whether r's job was seen outside at addr:port at time at:
// one of its attributions has addr (an unspecified one: every address of
// its family) and, unless it is the job's own address, port in its block.
func (r LeaseRecord) seenAt(addr netip.Addr, port uint16, at time.Time) bool {
	if !r.covers(at) {
		return false
	}
	for _, a := range Attributions(r) {
		if a.Own {
			if a.Addr == addr {
				return true
			}
			continue
		}
		sameFamily := a.Addr.Is4() == addr.Is4()
		if (a.Addr == addr || a.Addr.IsUnspecified() && sameFamily) && a.PortLo <= port && port <= a.PortHi {
			return true
		}
	}
	return false
}

// legacyLeaseRecord holds the fields a LeaseRecord had before it kept
// lists (one per address family); UnmarshalJSON turns them into the
// lists, so histories written by older gateways answer whois alike.
type legacyLeaseRecord struct {
	TunnelAddr  netip.Addr `json:"tunnel_addr"`
	TunnelAddr6 netip.Addr `json:"tunnel_addr6"`
	PublicAddr  netip.Addr `json:"public_addr"`
	PortLo      uint16     `json:"port_lo"`
	PortHi      uint16     `json:"port_hi"`
	PublicAddr6 netip.Addr `json:"public_addr6"`
	Own6        bool       `json:"own6"`
}

// UnmarshalJSON decodes a record, also one in the format before lists.
func (r *LeaseRecord) UnmarshalJSON(b []byte) error {
	type plain LeaseRecord
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	*r = LeaseRecord(p)
	if len(r.TunnelAddrs) > 0 || len(r.Egress) > 0 {
		return nil
	}
	var old legacyLeaseRecord
	if err := json.Unmarshal(b, &old); err != nil {
		return err
	}
	for _, a := range []netip.Addr{old.TunnelAddr, old.TunnelAddr6} {
		if a.IsValid() {
			r.TunnelAddrs = append(r.TunnelAddrs, a)
		}
	}
	if old.PublicAddr.IsValid() && old.PortLo <= old.PortHi && !(old.PublicAddr.IsUnspecified() && old.PublicAddr6.IsValid()) {
		r.Egress = append(r.Egress, Attribution{Addr: old.PublicAddr, PortLo: old.PortLo, PortHi: old.PortHi})
	}
	switch {
	case old.PublicAddr6.IsValid() && old.Own6:
		r.Egress = append(r.Egress, Attribution{Addr: old.PublicAddr6, PortHi: 65535, Own: true})
	case old.PublicAddr6.IsValid() && old.PortHi != 0:
		r.Egress = append(r.Egress, Attribution{Addr: old.PublicAddr6, PortLo: old.PortLo, PortHi: old.PortHi})
	}
	return nil
}

func attrKey(addr netip.Addr, port uint16, start time.Time, id string) []byte {
	k := make([]byte, 0, 26+len(id))
	a := addr.As16()
	k = append(k, a[:]...)
	k = binary.BigEndian.AppendUint16(k, port)
	k = binary.BigEndian.AppendUint64(k, uint64(start.UnixNano()))
	return append(k, id...)
}

// RecordLeaseStart adds r (with zero End) to the history.
func (s *Store) RecordLeaseStart(r LeaseRecord) error {
	if r.ID == "" {
		return fmt.Errorf("record lease: empty id")
	}
	for _, a := range r.Egress {
		if !a.Addr.IsValid() || a.PortHi < a.PortLo {
			return fmt.Errorf("record lease %s: egress %v port block %d-%d: want an address and LO <= HI", r.ID, a.Addr, a.PortLo, a.PortHi)
		}
	}
	v, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("record lease %s: %w", r.ID, err)
	}
	// Group commit (commit.go): joins that arrive together share one
	// transaction and one fsync, and a lone one waits for nothing. The
	// function is idempotent, as that requires.
	err = s.commits.run(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketLeases).Put([]byte(r.ID), v); err != nil {
			return err
		}
		if err := s.journalTx(tx, r); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		for _, a := range Attributions(r) {
			if err := tx.Bucket(bucketAttribution).Put(a.key(r), nil); err != nil {
				return err
			}
			if a.Own {
				continue
			}
			span := a.PortHi - a.PortLo
			if old := meta.Get(metaMaxSpan); old == nil || binary.BigEndian.Uint16(old) < span {
				if err := meta.Put(metaMaxSpan, binary.BigEndian.AppendUint16(nil, span)); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("record lease %s: %w", r.ID, err)
	}
	return nil
}

// RecordLeaseEnd sets the end time and reason of lease id, if it has none
// yet. An unknown id returns ErrNotFound.
func (s *Store) RecordLeaseEnd(id string, end time.Time, reason string) error {
	err := s.commits.run(func(tx *bolt.Tx) error { // idempotent; see RecordLeaseStart
		b := tx.Bucket(bucketLeases)
		v := b.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		var r LeaseRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if !r.End.IsZero() {
			return nil
		}
		r.End, r.EndReason, r.Resume = end, reason, nil
		nv, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if err := s.journalTx(tx, r); err != nil {
			return err
		}
		return b.Put([]byte(id), nv)
	})
	if err != nil {
		return fmt.Errorf("record end of lease %s: %w", id, err)
	}
	return nil
}

// EndActiveLeases closes every record that has no end yet, at end with
// reason, and returns how many it closed. A gateway calls it at start for
// leases a crash left open.
func (s *Store) EndActiveLeases(end time.Time, reason string) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		type upd struct{ k, v []byte }
		var todo []upd
		err := b.ForEach(func(k, v []byte) error {
			var r LeaseRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("lease %q: %w", k, err)
			}
			if !r.End.IsZero() {
				return nil
			}
			r.End, r.EndReason, r.Resume = end, reason, nil
			nv, err := json.Marshal(r)
			if err != nil {
				return err
			}
			if err := s.journalTx(tx, r); err != nil {
				return err
			}
			todo = append(todo, upd{bytes.Clone(k), nv})
			return nil
		})
		if err != nil {
			return err
		}
		for _, u := range todo {
			if err := b.Put(u.k, u.v); err != nil {
				return err
			}
		}
		n = len(todo)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("end active leases: %w", err)
	}
	return n, nil
}

// ActiveLeases returns the records that have no end yet, oldest first: the
// leases a gateway that stopped (or crashed) left live, which a restart
// restores.
func (s *Store) ActiveLeases() ([]LeaseRecord, error) {
	all, err := s.Leases()
	if err != nil {
		return nil, err
	}
	var out []LeaseRecord
	for _, r := range all {
		if r.End.IsZero() {
			out = append(out, r)
		}
	}
	return out, nil
}

// Whois returns the leases whose port block on addr contained port at time
// at, or whose own address addr was then, newest first. Normally that is
// one lease or none. Records whose public address is unspecified (0.0.0.0
// or ::, "every address of the gateway host", as user-mode egress records
// them) match every address of their family.
func (s *Store) Whois(addr netip.Addr, port uint16, at time.Time) ([]LeaseRecord, error) {
	var out []LeaseRecord
	addr = addr.Unmap()
	keys := []netip.Addr{addr}
	if unspec := ipfamily.Of(addr).Unspecified; addr != unspec {
		keys = append(keys, unspec)
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		seen := map[string]bool{}
		for _, k := range keys {
			var err error
			if out, err = whoisTx(tx, k, addr, port, at, seen, out); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("whois %s:%d: %w", addr, port, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.After(out[j].Start) })
	return out, nil
}

// whoisTx appends to out the records seen at addr:port at time at among the
// candidates of attribution keys of keyAddr (addr, or its family's
// unspecified address): those whose first port lies up to the widest block
// below port, and those of own addresses (first port 0). seen holds the
// ids appended already.
func whoisTx(tx *bolt.Tx, keyAddr, addr netip.Addr, port uint16, at time.Time, seen map[string]bool, out []LeaseRecord) ([]LeaseRecord, error) {
	a16 := keyAddr.As16()
	var span uint16
	if v := tx.Bucket(bucketMeta).Get(metaMaxSpan); v != nil {
		span = binary.BigEndian.Uint16(v)
	}
	leases := tx.Bucket(bucketLeases)
	consider := func(k []byte) error {
		id := string(k[26:])
		if seen[id] {
			return nil
		}
		v := leases.Get(k[26:])
		if v == nil {
			return nil // pruned
		}
		var r LeaseRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return fmt.Errorf("lease %q: %w", id, err)
		}
		if r.seenAt(addr, port, at) {
			seen[id] = true
			out = append(out, r)
		}
		return nil
	}
	c := tx.Bucket(bucketAttribution).Cursor()
	// Start just above every key with first port == port and walk down
	// to first port == port-span.
	seek := attrKey(keyAddr, port, time.Unix(0, -1), "")
	k, _ := c.Seek(append(seek, 0xff))
	if k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for ; k != nil; k, _ = c.Prev() {
		if len(k) < 26 || !bytes.Equal(k[:16], a16[:]) {
			break
		}
		lo := binary.BigEndian.Uint16(k[16:18])
		if lo > port {
			continue
		}
		if port-lo > span {
			break
		}
		if err := consider(k); err != nil {
			return out, err
		}
	}
	// Own addresses: first port 0, whatever the port asked.
	own := attrKey(keyAddr, 0, time.Time{}, "")[:18]
	for k, _ := c.Seek(own); k != nil && bytes.HasPrefix(k, own); k, _ = c.Next() {
		if len(k) < 26 {
			continue
		}
		if err := consider(k); err != nil {
			return out, err
		}
	}
	return out, nil
}

// Leases returns every lease record, oldest first.
func (s *Store) Leases() ([]LeaseRecord, error) {
	var out []LeaseRecord
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketLeases).ForEach(func(k, v []byte) error {
			var r LeaseRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("lease %q: %w", k, err)
			}
			out = append(out, r)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list leases: %w", err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out, nil
}

// PruneLeases deletes records that ended before cutoff and returns how many
// it deleted. Active leases are kept whatever their age.
func (s *Store) PruneLeases(cutoff time.Time) (int, error) {
	n := 0
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLeases)
		attr := tx.Bucket(bucketAttribution)
		var leaseKeys, attrKeys [][]byte
		err := b.ForEach(func(k, v []byte) error {
			var r LeaseRecord
			if err := json.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("lease %q: %w", k, err)
			}
			if r.End.IsZero() || !r.End.Before(cutoff) {
				return nil
			}
			leaseKeys = append(leaseKeys, bytes.Clone(k))
			for _, a := range Attributions(r) {
				attrKeys = append(attrKeys, a.key(r))
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, k := range attrKeys {
			if err := attr.Delete(k); err != nil {
				return err
			}
		}
		for _, k := range leaseKeys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		n = len(leaseKeys)
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("prune leases: %w", err)
	}
	return n, nil
}
