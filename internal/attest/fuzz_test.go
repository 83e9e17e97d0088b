// SPDX-License-Identifier: MIT

package attest

import (
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// FuzzParsePayload feeds arbitrary bytes to both payload parsers: what a
// credential's maker wrote is all the gateway reads of it. Invariants: no
// panic; an accepted payload has its required fields, printable and
// within bounds, and survives a round trip (Marshal, then parse: the same
// value).
func FuzzParsePayload(f *testing.F) {
	var k wgkey.Key
	k[0] = 9
	f.Add(JoinPayload{Gateway: "sha256:" + strings.Repeat("ab", 32), Key: k}.Marshal())
	f.Add(JoinPayload{Gateway: "sha256:" + strings.Repeat("0", 64), Key: k, JobCred: strings.Repeat("c", 64)}.Marshal())
	f.Add(JobPayload{Batch: "slurm", JobID: "4242", Step: "batch", UID: 1000, GID: 100, Node: "cn1"}.Marshal())
	f.Add([]byte("airlock-job/1\nbatch=slurm\njob=1\nuid=0\ngid=0\n"))
	f.Add([]byte("airlock-join/1\ngateway=x\ngateway=y\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if p, err := ParseJoinPayload(b); err == nil {
			if p.Key.IsZero() || !strings.HasPrefix(p.Gateway, "sha256:") {
				t.Fatalf("accepted join payload without its fields: %+v", p)
			}
			again, err := ParseJoinPayload(p.Marshal())
			if err != nil || again != p {
				t.Fatalf("join payload %+v: round trip %+v %v", p, again, err)
			}
		}
		if p, err := ParseJobPayload(b); err == nil {
			for _, v := range []string{p.Batch, p.JobID, p.Step, p.Node} {
				if len(v) > maxValue || !printable(v) {
					t.Fatalf("accepted job payload with value %q", v)
				}
			}
			if p.Batch == "" || p.JobID == "" {
				t.Fatalf("accepted job payload without batch or job: %+v", p)
			}
			again, err := ParseJobPayload(p.Marshal())
			if err != nil || again != p {
				t.Fatalf("job payload %+v: round trip %+v %v", p, again, err)
			}
		}
	})
}
