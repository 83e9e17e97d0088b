// SPDX-License-Identifier: MIT

package store

import (
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestJournal(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t0 := time.Now()
	r := LeaseRecord{ID: "a", TunnelAddrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, Start: t0, Resume: &ResumeState{PublicKey: "k"}}
	if err := s.RecordLeaseStart(r); err != nil {
		t.Fatal(err)
	}
	if n, _ := s.JournalLen(); n != 0 {
		t.Fatalf("journal without EnableJournal: got %d entries, want 0", n)
	}
	s.EnableJournal()
	r.ID = "b"
	if err := s.RecordLeaseStart(r); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordLeaseEnd("b", t0.Add(time.Minute), "released"); err != nil {
		t.Fatal(err)
	}
	if err := s.RecordLeaseEnd("b", t0.Add(2*time.Minute), "again"); err != nil {
		t.Fatal(err)
	}
	es, err := s.Journal(10)
	if err != nil || len(es) != 2 {
		t.Fatalf("journal: got %d %v, want 2 entries (start, end)", len(es), err)
	}
	if es[0].Record.ID != "b" || !es[0].Record.End.IsZero() || es[0].Record.Resume != nil {
		t.Errorf("first entry: got %+v, want b's start without resume state", es[0].Record)
	}
	if es[1].Record.EndReason != "released" || es[1].Seq <= es[0].Seq {
		t.Errorf("second entry: got %+v seq %d, want b's end after %d", es[1].Record, es[1].Seq, es[0].Seq)
	}
	if err := s.JournalDone(es[0].Seq); err != nil {
		t.Fatal(err)
	}
	if es2, _ := s.Journal(10); len(es2) != 1 || es2[0].Seq != es[1].Seq {
		t.Fatalf("after JournalDone(first): got %+v, want the second only", es2)
	}
}

func TestBansAndReplica(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	now := time.Now()
	if _, err := s.AddBan(Ban{Token: "t", Host: "h", Until: now.Add(-time.Second), Created: now.Add(-time.Hour)}); err != nil {
		t.Fatal(err)
	}
	b, err := s.AddBan(Ban{Token: "t", Addr: netip.MustParseAddr("192.0.2.1"), Until: now.Add(time.Hour), Created: now})
	if err != nil {
		t.Fatal(err)
	}
	if bans, _ := s.Bans(now); len(bans) != 1 || bans[0].ID != b.ID {
		t.Fatalf("bans: got %+v, want the one in force", bans)
	}
	secret, _ := NewTokenSecret()
	tok := Token{Name: "fleet", Hash: HashToken(secret), Created: now}
	if err := s.ReplaceTokens([]Token{tok}, []Ban{{ID: 7, Token: "fleet", Host: "n", Until: now.Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.VerifyToken(secret, now); err != nil || got.Name != "fleet" {
		t.Fatalf("verify replicated token: got %+v %v", got, err)
	}
	bans, _ := s.Bans(now)
	if len(bans) != 1 || bans[0].ID != 7 {
		t.Fatalf("replicated bans: got %+v, want id 7", bans)
	}
	if nb, _ := s.AddBan(Ban{Token: "x", Host: "y", Until: now.Add(time.Hour), Created: now}); nb.ID != 8 {
		t.Fatalf("next ban id after replica: got %d, want 8", nb.ID)
	}
}

// TestMemberID: the fleet member id is made once and kept with the state
// (a reopen, i.e. a gateway's restart, reads the same).
func TestMemberID(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	s, err := Open(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.MemberID()
	if err != nil || !strings.HasPrefix(id, "gw-") || len(id) != 27 {
		t.Fatalf("member id: got %q %v, want gw- and 24 hex digits", id, err)
	}
	if again, _ := s.MemberID(); again != id {
		t.Errorf("second call: got %q, want %q", again, id)
	}
	s.Close()
	if s, err = Open(path, 0); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got, _ := s.MemberID(); got != id {
		t.Errorf("after reopen: got %q, want %q", got, id)
	}
	other, err := Open(filepath.Join(t.TempDir(), FileName), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if o, _ := other.MemberID(); o == id {
		t.Errorf("another state directory got the same member id %q", o)
	}
}
