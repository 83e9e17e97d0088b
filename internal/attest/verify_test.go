// SPDX-License-Identifier: MIT

package attest

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

const testPin = "sha256:" + "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func newKey(t *testing.T) wgkey.Key {
	t.Helper()
	k, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	return k.PublicKey()
}

// TestVerify runs the gateway's checks against a real munged: what a
// join credential attests, and every way a join that claims more than
// its credentials prove is refused (issue 25, item 1).
func TestVerify(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	mc := munge.Client{Socket: d.Socket}
	me := uint32(os.Getuid())
	v := &Verifier{Munge: mc, Pin: testPin, JobUIDs: []uint32{me}, LookupUser: func(uid uint32) string {
		if uid == me {
			return "alice"
		}
		return ""
	}}
	ctx := context.Background()
	node := netip.MustParseAddrPort("127.0.0.1:40000")
	join := func(t *testing.T, pin string, key wgkey.Key, jobCred string) string {
		t.Helper()
		c, err := MakeJoin(ctx, mc, pin, key, jobCred)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	job := func(t *testing.T, p JobPayload) string {
		t.Helper()
		c, err := MakeJob(ctx, mc, p, 300)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	req := func(key wgkey.Key, cred, jobCred string) control.JoinRequest {
		return control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: int(me), User: "alice"},
			Attest: &control.Attest{Munge: cred, MungeJob: jobCred}}
	}

	t.Run("Attested", func(t *testing.T) {
		key := newKey(t)
		cred := join(t, testPin, key, "")
		a, err := v.Verify(ctx, req(key, cred, ""), node)
		if err != nil {
			t.Fatal(err)
		}
		if a.By != "munge" || a.UID != me || a.GID != uint32(os.Getgid()) || a.User != "alice" || a.Node.String() != "127.0.0.1" || a.Job != nil {
			t.Errorf("attestation %+v, want munge uid %d gid %d alice on 127.0.0.1, no job", a, me, os.Getgid())
		}
		// The same credential again: munged's replay detection.
		if _, err := v.Verify(ctx, req(key, cred, ""), node); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
			t.Errorf("replayed credential: %v, want a refusal saying it was used before", err)
		}
	})

	t.Run("JobAttested", func(t *testing.T) {
		key := newKey(t)
		jc := job(t, JobPayload{Batch: "slurm", JobID: "4242", Step: "0", UID: me, GID: uint32(os.Getgid()), Node: "cn1"})
		r := req(key, join(t, testPin, key, jc), jc)
		r.Job.BatchJobID, r.Job.BatchSystem = "4242", "slurm"
		a, err := v.Verify(ctx, r, node)
		if err != nil {
			t.Fatal(err)
		}
		if j := a.Job; j == nil || j.JobID != "4242" || j.BatchSystem != "slurm" || j.Step != "0" || j.Node != "cn1" || j.MadeBy != me {
			t.Errorf("attested job %+v, want slurm 4242 step 0 on cn1 made by uid %d", a.Job, me)
		}
		// The job credential is spent: another join credential bound to
		// it (the job's user, racing the job) is refused.
		key2 := newKey(t)
		if _, err := v.Verify(ctx, req(key2, join(t, testPin, key2, jc), jc), node); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "job credential was used before") {
			t.Errorf("second join with the job credential: %v, want a replay refusal", err)
		}
	})

	for _, tc := range []struct {
		name string
		make func(t *testing.T) (control.JoinRequest, netip.AddrPort)
		want string
	}{
		{"ClaimsAnotherUID", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			r := req(key, join(t, testPin, key, ""), "")
			r.Job.UID = int(me) + 1
			if me != 0 {
				r.Job.UID = 0
			}
			return r, node
		}, "claims uid"},
		{"ClaimsAnotherUser", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			r := req(key, join(t, testPin, key, ""), "")
			r.Job.User = "root"
			return r, node
		}, `claims user "root"`},
		{"AnotherGateway", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			return req(key, join(t, "sha256:"+strings.Repeat("f", 64), key, ""), ""), node
		}, "made for gateway"},
		{"AnotherKey", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			return req(newKey(t), join(t, testPin, newKey(t), ""), ""), node
		}, "made for WireGuard key"},
		{"AnotherHost", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			return req(key, join(t, testPin, key, ""), ""), netip.MustParseAddrPort("192.0.2.9:40000")
		}, "made on node 127.0.0.1 but the join comes from 192.0.2.9"},
		{"AnotherMUNGEKey", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			other := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
			key := newKey(t)
			c, err := MakeJoin(ctx, munge.Client{Socket: other.Socket}, testPin, key, "")
			if err != nil {
				t.Fatal(err)
			}
			return req(key, c, ""), node
		}, "does not decode with the gateway's MUNGE key"},
		{"JobForAnotherUID", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			jc := job(t, JobPayload{Batch: "slurm", JobID: "1", UID: me + 1, GID: 1})
			return req(key, join(t, testPin, key, jc), jc), node
		}, "job credential is for a job of uid"},
		{"JobNotBound", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			jc := job(t, JobPayload{Batch: "slurm", JobID: "2", UID: me, GID: 1})
			return req(key, join(t, testPin, key, ""), jc), node
		}, "does not name"},
		{"JobClaimedOther", func(t *testing.T) (control.JoinRequest, netip.AddrPort) {
			key := newKey(t)
			jc := job(t, JobPayload{Batch: "slurm", JobID: "3", UID: me, GID: 1})
			r := req(key, join(t, testPin, key, jc), jc)
			r.Job.BatchJobID = "4"
			return r, node
		}, `claims batch job "4"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, from := tc.make(t)
			a, err := v.Verify(ctx, r, from)
			if !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %+v, %v; want ErrAttestation saying %q", a, err, tc.want)
			}
		})
	}

	t.Run("UntrustedJobMaker", func(t *testing.T) {
		// A job credential made by another uid than the trusted one.
		strict := *v
		strict.JobUIDs = []uint32{me + 7}
		key := newKey(t)
		jc := job(t, JobPayload{Batch: "slurm", JobID: "5", UID: me, GID: 1})
		if _, err := strict.Verify(ctx, req(key, join(t, testPin, key, jc), jc), node); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "does not trust") {
			t.Errorf("job credential of an untrusted uid: %v, want a refusal", err)
		}
	})

	t.Run("KeyRotation", func(t *testing.T) {
		// A client given both pins of a rotation binds both; the gateway
		// serves both and takes it, and takes a client that knows only
		// the new one.
		other := "sha256:" + strings.Repeat("e", 64)
		rot := *v
		rot.Pins = func() []string { return []string{testPin, other} }
		for _, pins := range []string{testPin + "|" + other, other} {
			key := newKey(t)
			if _, err := rot.Verify(ctx, req(key, join(t, pins, key, ""), ""), node); err != nil {
				t.Errorf("credential for pins %s at a gateway serving both: %v", pins, err)
			}
		}
		key := newKey(t)
		if _, err := v.Verify(ctx, req(key, join(t, other, key, ""), ""), node); !errors.Is(err, control.ErrAttestation) {
			t.Errorf("credential for the next pin only, at a gateway serving the current one: %v, want refused", err)
		}
	})

	t.Run("OriginAny", func(t *testing.T) {
		lax := *v
		lax.Origin = OriginAny
		key := newKey(t)
		if _, err := lax.Verify(ctx, req(key, join(t, testPin, key, ""), ""), netip.MustParseAddrPort("192.0.2.9:1")); err != nil {
			t.Errorf("origin any, join from elsewhere: %v", err)
		}
	})

	t.Run("OtherUser", func(t *testing.T) {
		// A credential munge(1) made as another user attests that user.
		if os.Getuid() != 0 {
			t.Skip("needs root to run munge(1) as another user")
		}
		nobody := func(key wgkey.Key) string {
			cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--", "munge", "--socket", d.Socket, "--ttl", "60")
			cmd.Stdin = strings.NewReader(string(JoinPayload{Gateway: testPin, Key: key}.Marshal()))
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimSpace(string(out))
		}
		key := newKey(t)
		r := req(key, nobody(key), "")
		r.Job.UID, r.Job.User = 65534, ""
		a, err := v.Verify(ctx, r, node)
		if err != nil || a.UID != 65534 {
			t.Errorf("credential of uid 65534: %+v %v", a, err)
		}
		key = newKey(t)
		r = req(key, nobody(key), "")
		r.Job.UID, r.Job.User = 0, "" // nobody claiming root
		if _, err := v.Verify(ctx, r, node); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "claims uid 0 but its credential was made by uid 65534") {
			t.Errorf("nobody's credential claiming uid 0: %v, want a refusal", err)
		}
	})
}

// TestHeldJobCredential: a job credential decoded for a join that the
// gateway refused for a reason that clears with time is held for the
// job's retry (issue 33, item 1); while one join uses it, another is
// refused; a join admitted or refused for good spends it.
func TestHeldJobCredential(t *testing.T) {
	d := mungetest.Start(t, mungetest.Options{Origin: "127.0.0.1"})
	mc := munge.Client{Socket: d.Socket}
	me := uint32(os.Getuid())
	v := &Verifier{Munge: mc, Pin: testPin, JobUIDs: []uint32{me}, Holds: &Holds{}, LookupUser: func(uint32) string { return "" }}
	ctx := context.Background()
	node := netip.MustParseAddrPort("127.0.0.1:40000")
	jc, err := MakeJob(ctx, mc, JobPayload{Batch: "slurm", JobID: "77", UID: me, GID: 1}, 300)
	if err != nil {
		t.Fatal(err)
	}
	attempt := func() (control.JoinRequest, error) {
		key := newKey(t)
		c, err := MakeJoin(ctx, mc, testPin, key, jc)
		if err != nil {
			t.Fatal(err)
		}
		r := control.JoinRequest{PublicKey: key, Job: control.JobInfo{UID: int(me)}, Attest: &control.Attest{Munge: c, MungeJob: jc}}
		_, err = v.Verify(ctx, r, node)
		return r, err
	}
	first, err := attempt()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := attempt(); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "being used by another join") {
		t.Errorf("second join while the first is being admitted: %v, want refused", err)
	}
	v.Settle(first, fmt.Errorf("%w: max_leases", control.ErrQuota))
	retry, err := attempt()
	if err != nil {
		t.Fatalf("retry after a quota refusal: %v, want the held job credential to attest it", err)
	}
	if v.Holds.Len() != 1 {
		t.Errorf("held %d, want 1", v.Holds.Len())
	}
	v.Settle(retry, nil)
	if _, err := attempt(); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
		t.Errorf("after the job joined: %v, want a replay refusal", err)
	}
	if v.Holds.Len() != 0 {
		t.Errorf("held %d after the join, want 0", v.Holds.Len())
	}
	// A definite refusal spends it too.
	jc2, err := MakeJob(ctx, mc, JobPayload{Batch: "slurm", JobID: "78", UID: me, GID: 1}, 300)
	if err != nil {
		t.Fatal(err)
	}
	jc = jc2
	r, err := attempt()
	if err != nil {
		t.Fatal(err)
	}
	v.Settle(r, fmt.Errorf("%w: banned", control.ErrBanned))
	if _, err := attempt(); !errors.Is(err, control.ErrAttestation) || !strings.Contains(err.Error(), "used before") {
		t.Errorf("after a ban: %v, want a replay refusal", err)
	}
}
