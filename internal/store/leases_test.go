// SPDX-License-Identifier: MIT

package store

import (
	"net/netip"
	"path/filepath"
	"testing"
	"time"
)

func TestWhois(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	pub := netip.MustParseAddr("203.0.113.1")
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	recs := []LeaseRecord{
		{ID: "a", JobID: "job-a", PublicAddr: pub, PortLo: 20000, PortHi: 20255, Start: t0},
		{ID: "b", JobID: "job-b", PublicAddr: pub, PortLo: 20256, PortHi: 20511, Start: t0.Add(time.Minute)},
		// c reuses a's block after a ended.
		{ID: "c", JobID: "job-c", PublicAddr: pub, PortLo: 20000, PortHi: 20255, Start: t0.Add(2 * time.Hour)},
		{ID: "d", JobID: "job-d", PublicAddr: netip.MustParseAddr("203.0.113.9"), PortLo: 20000, PortHi: 20255, Start: t0},
		{ID: "noblock", JobID: "x", Start: t0},
	}
	for _, r := range recs {
		if err := s.RecordLeaseStart(r); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RecordLeaseEnd("a", t0.Add(time.Hour), "released"); err != nil {
		t.Fatal(err)
	}
	// Persisted across a reopen, as after a gateway restart.
	s.Close()
	if s, err = Open(path, 0); err != nil {
		t.Fatal(err)
	}
	defer s.Close()

	tests := []struct {
		addr string
		port uint16
		at   time.Time
		want string // job id, "" for none
	}{
		{"203.0.113.1", 20000, t0.Add(30 * time.Minute), "job-a"},
		{"203.0.113.1", 20255, t0.Add(30 * time.Minute), "job-a"},
		{"203.0.113.1", 20256, t0.Add(30 * time.Minute), "job-b"},
		{"203.0.113.1", 20100, t0.Add(90 * time.Minute), ""}, // a ended, c not started
		{"203.0.113.1", 20100, t0.Add(3 * time.Hour), "job-c"},
		{"203.0.113.1", 20100, t0.Add(-time.Minute), ""},
		{"203.0.113.1", 19999, t0.Add(30 * time.Minute), ""},
		{"203.0.113.1", 20512, t0.Add(30 * time.Minute), ""},
		{"203.0.113.9", 20001, t0.Add(30 * time.Minute), "job-d"},
		{"::ffff:203.0.113.9", 20001, t0.Add(30 * time.Minute), "job-d"},
		{"198.51.100.1", 20001, t0.Add(30 * time.Minute), ""},
	}
	for _, tt := range tests {
		got, err := s.Whois(netip.MustParseAddr(tt.addr), tt.port, tt.at)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if len(got) > 0 {
			id = got[0].JobID
		}
		if id != tt.want || len(got) > 1 {
			t.Errorf("whois %s:%d at %v: got %q (%d records), want %q", tt.addr, tt.port, tt.at.Format(time.Kitchen), id, len(got), tt.want)
		}
	}

	n, err := s.EndActiveLeases(t0.Add(4*time.Hour), "gateway restarted")
	if err != nil || n != 4 {
		t.Errorf("end active: got %d, %v; want 4", n, err)
	}
	n, err = s.PruneLeases(t0.Add(90 * time.Minute))
	if err != nil || n != 1 {
		t.Errorf("prune: got %d, %v; want 1 (lease a)", n, err)
	}
	if got, _ := s.Whois(pub, 20000, t0.Add(30*time.Minute)); len(got) != 0 {
		t.Errorf("pruned lease still answers: %+v", got)
	}
	all, err := s.Leases()
	if err != nil || len(all) != 4 {
		t.Errorf("leases after prune: %d, %v; want 4", len(all), err)
	}
}

// TestWhoisUnspecified checks records of user-mode egress, whose public
// address is 0.0.0.0 ("every address of the host"): they answer for any
// IPv4 address of the gateway, next to records of a specific address.
func TestWhoisUnspecified(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)
	for _, r := range []LeaseRecord{
		{ID: "u", JobID: "job-u", PublicAddr: netip.IPv4Unspecified(), PortLo: 32768, PortHi: 33023, Start: t0},
		{ID: "k", JobID: "job-k", PublicAddr: netip.MustParseAddr("203.0.113.1"), PortLo: 20000, PortHi: 20255, Start: t0},
	} {
		if err := s.RecordLeaseStart(r); err != nil {
			t.Fatal(err)
		}
	}
	at := t0.Add(time.Minute)
	for _, tt := range []struct {
		addr string
		port uint16
		want string
	}{
		{"203.0.113.1", 32800, "job-u"},
		{"198.51.100.1", 33023, "job-u"},
		{"0.0.0.0", 32768, "job-u"},
		{"203.0.113.1", 20000, "job-k"},
		{"198.51.100.1", 20000, ""},
		{"203.0.113.1", 33024, ""},
		{"2001:db8::1", 32800, ""},
	} {
		got, err := s.Whois(netip.MustParseAddr(tt.addr), tt.port, at)
		if err != nil {
			t.Fatal(err)
		}
		var id string
		if len(got) > 0 {
			id = got[0].JobID
		}
		if id != tt.want || len(got) > 1 {
			t.Errorf("whois %s:%d: got %q (%d records), want %q", tt.addr, tt.port, id, len(got), tt.want)
		}
	}
}
