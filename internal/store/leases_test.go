// SPDX-License-Identifier: MIT

package store

import (
	"encoding/json"
	"net/netip"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"
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
		{ID: "a", JobID: "job-a", Egress: []Attribution{{Addr: pub, PortLo: 20000, PortHi: 20255}}, Start: t0},
		{ID: "b", JobID: "job-b", Egress: []Attribution{{Addr: pub, PortLo: 20256, PortHi: 20511}}, Start: t0.Add(time.Minute)},
		// c reuses a's block after a ended.
		{ID: "c", JobID: "job-c", Egress: []Attribution{{Addr: pub, PortLo: 20000, PortHi: 20255}}, Start: t0.Add(2 * time.Hour)},
		{ID: "d", JobID: "job-d", Egress: []Attribution{{Addr: netip.MustParseAddr("203.0.113.9"), PortLo: 20000, PortHi: 20255}}, Start: t0},
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
		{ID: "u", JobID: "job-u", Egress: []Attribution{{Addr: netip.IPv4Unspecified(), PortLo: 32768, PortHi: 33023}}, Start: t0},
		{ID: "k", JobID: "job-k", Egress: []Attribution{{Addr: netip.MustParseAddr("203.0.113.1"), PortLo: 20000, PortHi: 20255}}, Start: t0},
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

// TestWhoisBothFamilies: a lease's IPv6 egress address answers whois with
// its port block like its IPv4 one; a job's own IPv6 address (Own)
// answers by address and time alone; pruning removes every key.
func TestWhoisBothFamilies(t *testing.T) {
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
		{ID: "a", JobID: "job-a", Egress: []Attribution{{Addr: pub4, PortLo: 20000, PortHi: 20255}, {Addr: pub6, PortLo: 20000, PortHi: 20255}}, Start: t0},
		{ID: "b", JobID: "job-b", Egress: []Attribution{{Addr: pub4, PortLo: 20256, PortHi: 20511}, {Addr: own, Own: true}}, Start: t0},
		// An IPv6-only job's block: no IPv4 address on record.
		{ID: "c", JobID: "job-c", Egress: []Attribution{{Addr: pub6, PortLo: 20512, PortHi: 20767}}, Start: t0},
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
		{pub6, 20600, t0.Add(time.Minute), "job-c"},
		{pub4, 20600, t0.Add(time.Minute), ""},
		{netip.IPv4Unspecified(), 20600, t0.Add(time.Minute), ""},
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

// TestLegacyRecord: a record in the format before lists (one field per
// family) is read as lists, and whois finds it as before.
func TestLegacyRecord(t *testing.T) {
	for _, tc := range []struct {
		json        string
		tunnel      []netip.Addr
		attribution []Attribution
	}{
		{`{"id":"a","tunnel_addr":"100.64.0.2","public_addr":"203.0.113.1","port_lo":20000,"port_hi":20255,"start":"2026-11-23T10:00:00Z"}`,
			[]netip.Addr{netip.MustParseAddr("100.64.0.2")},
			[]Attribution{{Addr: netip.MustParseAddr("203.0.113.1"), PortLo: 20000, PortHi: 20255}}},
		{`{"id":"b","tunnel_addr":"100.64.0.3","tunnel_addr6":"fd00::6440:3","public_addr":"203.0.113.1","public_addr6":"2001:db8::1","port_lo":20256,"port_hi":20511,"start":"2026-11-23T10:00:00Z"}`,
			[]netip.Addr{netip.MustParseAddr("100.64.0.3"), netip.MustParseAddr("fd00::6440:3")},
			[]Attribution{{Addr: netip.MustParseAddr("203.0.113.1"), PortLo: 20256, PortHi: 20511}, {Addr: netip.MustParseAddr("2001:db8::1"), PortLo: 20256, PortHi: 20511}}},
		{`{"id":"c","tunnel_addr":"100.64.0.4","tunnel_addr6":"fd00::6440:4","public_addr":"203.0.113.1","public_addr6":"2001:db8:aa::6440:4","own6":true,"port_lo":20512,"port_hi":20767,"start":"2026-11-23T10:00:00Z"}`,
			[]netip.Addr{netip.MustParseAddr("100.64.0.4"), netip.MustParseAddr("fd00::6440:4")},
			[]Attribution{{Addr: netip.MustParseAddr("203.0.113.1"), PortLo: 20512, PortHi: 20767}, {Addr: netip.MustParseAddr("2001:db8:aa::6440:4"), PortHi: 65535, Own: true}}},
		// The 0.0.0.0 an IPv6-only job's block was carried on is dropped.
		{`{"id":"d","tunnel_addr":"100.64.0.5","tunnel_addr6":"fd00::6440:5","public_addr":"0.0.0.0","public_addr6":"2001:db8::1","port_lo":20768,"port_hi":21023,"start":"2026-11-23T10:00:00Z"}`,
			[]netip.Addr{netip.MustParseAddr("100.64.0.5"), netip.MustParseAddr("fd00::6440:5")},
			[]Attribution{{Addr: netip.MustParseAddr("2001:db8::1"), PortLo: 20768, PortHi: 21023}}},
	} {
		var r LeaseRecord
		if err := json.Unmarshal([]byte(tc.json), &r); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(r.TunnelAddrs, tc.tunnel) || !slices.Equal(Attributions(r), tc.attribution) {
			t.Errorf("%s: tunnel %v, attributions %+v; want %v, %+v", r.ID, r.TunnelAddrs, Attributions(r), tc.tunnel, tc.attribution)
		}
	}
}

// TestAttestedRecord: a lease's attestation survives the history, next to
// the claimed values, and the sources say which is which.
func TestAttestedRecord(t *testing.T) {
	s, _ := openTemp(t)
	att := &identity.Attestation{By: "munge", UID: 1000, GID: 100, User: "alice", Node: netip.MustParseAddr("10.1.2.3"), Made: t0,
		Job: &identity.AttestedJob{MadeBy: 0, BatchSystem: "slurm", JobID: "4242", Step: "0", Node: "cn1"}}
	pub := netip.MustParseAddr("192.0.2.1")
	for _, r := range []LeaseRecord{
		{ID: "a", JobID: "4242", UID: 1000, User: "alice", Attested: att, TunnelAddrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, Egress: []Attribution{{Addr: pub, PortLo: 20000, PortHi: 20255}}, Start: t0},
		{ID: "c", JobID: "99", UID: 7, TunnelAddrs: []netip.Addr{netip.MustParseAddr("100.64.0.3")}, Egress: []Attribution{{Addr: pub, PortLo: 20256, PortHi: 20511}}, Start: t0},
	} {
		if err := s.RecordLeaseStart(r); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Whois(pub, 20000, t0.Add(time.Second))
	if err != nil || len(got) != 1 || got[0].Attested == nil || got[0].Attested.Job == nil || got[0].Attested.Job.JobID != "4242" {
		t.Fatalf("whois: %+v %v, want the attested record", got, err)
	}
	if uid, src := got[0].UIDSource(); uid != 1000 || src != "munge" {
		t.Errorf("UIDSource: %d %s, want 1000 munge", uid, src)
	}
	if id, src := got[0].JobSource(); id != "4242" || src != "munge (uid 0)" {
		t.Errorf("JobSource: %s %s", id, src)
	}
	claimed, _ := s.Whois(pub, 20300, t0.Add(time.Second))
	if uid, src := claimed[0].UIDSource(); uid != 7 || src != identity.SourceClaimed {
		t.Errorf("claimed UIDSource: %d %s", uid, src)
	}
	if want := "munge: uid 1000 (alice) gid 100 on 10.1.2.3, job slurm 4242 step 0 (made by uid 0)"; att.String() != want {
		t.Errorf("String: %q, want %q", att.String(), want)
	}
}
