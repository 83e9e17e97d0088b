// SPDX-License-Identifier: MIT

package store

import (
	"errors"
	"net/netip"
	"testing"
	"time"
)

func TestImportToken(t *testing.T) {
	a, _ := openTemp(t)
	b, _ := openTemp(t)
	secret, _, err := a.CreateToken("cms", 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.ImportToken("cms", secret+"\n", time.Hour, t0); err != nil {
		t.Fatalf("import: %v", err)
	}
	tok, err := b.VerifyToken(secret, t0.Add(time.Minute))
	if err != nil || tok.Name != "cms" {
		t.Fatalf("imported token: %+v, %v", tok, err)
	}
	if _, err := b.VerifyToken(secret, t0.Add(2*time.Hour)); !errors.Is(err, ErrTokenExpired) {
		t.Errorf("imported token with ttl 1h after 2h: got %v, want ErrTokenExpired", err)
	}
	if _, err := b.ImportToken("other", secret, 0, t0); !errors.Is(err, ErrExists) {
		t.Errorf("same token under another name: got %v, want ErrExists", err)
	}
	for _, bad := range []string{"", "alk1_short", "xyz_" + secret[5:], secret + "x"} {
		if _, err := b.ImportToken("bad", bad, 0, t0); !errors.Is(err, ErrBadToken) {
			t.Errorf("import %q: got %v, want ErrBadToken", bad, err)
		}
	}
}

func TestActiveLeasesResume(t *testing.T) {
	s, _ := openTemp(t)
	rs := &ResumeState{SecretHash: make([]byte, 32), PublicKey: "k", Block: 3, Expose: []string{"8080/tcp"}}
	for _, id := range []string{"a", "b"} {
		if err := s.RecordLeaseStart(LeaseRecord{ID: id, TunnelAddrs: []netip.Addr{netip.MustParseAddr("100.64.0.2")}, Start: t0, Resume: rs}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.RecordLeaseEnd("a", t0.Add(time.Minute), "released"); err != nil {
		t.Fatal(err)
	}
	act, err := s.ActiveLeases()
	if err != nil || len(act) != 1 || act[0].ID != "b" || act[0].Resume == nil || act[0].Resume.Block != 3 {
		t.Fatalf("active leases: %+v, %v; want b with its resume state", act, err)
	}
	all, _ := s.Leases()
	for _, r := range all {
		if r.ID == "a" && r.Resume != nil {
			t.Errorf("ended lease kept its resume state (secret hash)")
		}
	}
	if n, err := s.EndActiveLeases(t0.Add(time.Hour), "gateway restarted"); err != nil || n != 1 {
		t.Fatalf("end active: %d, %v", n, err)
	}
	if act, _ := s.ActiveLeases(); len(act) != 0 {
		t.Errorf("active after EndActiveLeases: %+v", act)
	}
}
