// SPDX-License-Identifier: MIT

package store

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"
)

// TestWhoisIPv6: a lease's IPv6 egress address answers whois with its port
// block; a job's own IPv6 address (Own6) answers by address and time
// alone; pruning removes both keys.
func TestWhoisIPv6(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pub4 := netip.MustParseAddr("203.0.113.1")
	pub6 := netip.MustParseAddr("2001:db8:113::1")
	own := netip.MustParseAddr("2001:db8:aa::6440:3")
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	for _, r := range []LeaseRecord{
		{ID: "a", JobID: "job-a", PublicAddr: pub4, PublicAddr6: pub6, PortLo: 20000, PortHi: 20255, Start: t0},
		{ID: "b", JobID: "job-b", PublicAddr: pub4, PublicAddr6: own, Own6: true, PortLo: 20256, PortHi: 20511, Start: t0},
	} {
		if err := s.RecordLeaseStart(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RecordLeaseEnd("b", t0.Add(time.Hour), "released"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr netip.Addr
		port uint16
		at   time.Time
		want string
	}{
		{pub6, 20100, t0.Add(time.Minute), "job-a"},
		{pub4, 20100, t0.Add(time.Minute), "job-a"},
		{pub6, 20300, t0.Add(time.Minute), ""}, // b's IPv6 flows left from its own address
		{own, 80, t0.Add(time.Minute), "job-b"},
		{own, 65535, t0.Add(time.Minute), "job-b"},
		{own, 80, t0.Add(2 * time.Hour), ""},
		{netip.MustParseAddr("2001:db8:aa::6440:4"), 80, t0.Add(time.Minute), ""},
	} {
		recs, err := s.Whois(tc.addr, tc.port, tc.at)
		if err != nil {
			t.Fatal(err)
		}
		got := ""
		if len(recs) > 1 {
			t.Errorf("whois %v:%d: %d records, want at most 1", tc.addr, tc.port, len(recs))
		}
		if len(recs) > 0 {
			got = recs[0].JobID
		}
		if got != tc.want {
			t.Errorf("whois %v:%d at %v: got %q, want %q", tc.addr, tc.port, tc.at, got, tc.want)
		}
	}
	if n, err := s.PruneLeases(t0.Add(3 * time.Hour)); err != nil || n != 1 {
		t.Fatalf("PruneLeases: %d, %v; want 1", n, err)
	}
	if recs, _ := s.Whois(own, 80, t0.Add(time.Minute)); len(recs) != 0 {
		t.Errorf("whois after prune: %+v", recs)
	}
}
