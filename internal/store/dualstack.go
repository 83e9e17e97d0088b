// SPDX-License-Identifier: MIT

package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Dual-stack attribution. A lease with an IPv6 egress address
// (LeaseRecord.PublicAddr6) has a second attribution key for it: with its
// port block's first port like the IPv4 one, so whois [ADDR6]:PORT finds
// it the same way; or, for a job's own address (Own6, the gateway's
// --egress-prefix6), with first port 0, and whois finds it by address and
// time whatever the port.

// attrKey6 returns r's IPv6 attribution key, nil if it has none.
func attrKey6(r LeaseRecord) []byte {
	if !r.PublicAddr6.IsValid() || r.PublicAddr6 == r.PublicAddr {
		return nil
	}
	if r.Own6 {
		return attrKey(r.PublicAddr6, 0, r.Start, r.ID)
	}
	if r.PortHi < r.PortLo || r.PortHi == 0 {
		return nil
	}
	return attrKey(r.PublicAddr6, r.PortLo, r.Start, r.ID)
}

// putAttr6 adds r's IPv6 attribution key, if any.
func putAttr6(tx *bolt.Tx, r LeaseRecord) error {
	k := attrKey6(r)
	if k == nil {
		return nil
	}
	return tx.Bucket(bucketAttribution).Put(k, nil)
}

// whoisOwn6Tx appends to out the leases whose own IPv6 address was addr at
// time at.
func whoisOwn6Tx(tx *bolt.Tx, addr netip.Addr, at time.Time, out []LeaseRecord) ([]LeaseRecord, error) {
	if !addr.Is6() {
		return out, nil
	}
	leases := tx.Bucket(bucketLeases)
	prefix := attrKey(addr, 0, time.Time{}, "")[:18]
	c := tx.Bucket(bucketAttribution).Cursor()
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
		if len(k) < 26 {
			continue
		}
		v := leases.Get(k[26:])
		if v == nil {
			continue // pruned
		}
		var r LeaseRecord
		if err := json.Unmarshal(v, &r); err != nil {
			return out, fmt.Errorf("lease %q: %w", k[26:], err)
		}
		if r.Own6 && r.PublicAddr6 == addr && r.covers(at) {
			out = append(out, r)
		}
	}
	return out, nil
}
