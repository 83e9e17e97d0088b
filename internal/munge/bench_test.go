// SPDX-License-Identifier: MIT

package munge_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/munge"
	"github.com/airlock-vpn/airlock/internal/munge/mungetest"
)

// The per-join cost of attestation, two ways (bench/munge.sh runs these
// interleaved and keeps the raw results): a join costs one encode on the
// node (airlock run) and one decode on the gateway, or two with a job
// credential. Socket speaks munged's protocol in this package; Exec runs
// MUNGE's own munge(1) and unmunge(1), as a static binary without
// libmunge otherwise would.

var benchPayload = []byte("airlock-join/1\ngateway=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\nkey=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n")

func BenchmarkJoinCredentialSocket(b *testing.B) {
	d := mungetest.Start(b, mungetest.Options{Origin: "127.0.0.1"})
	c := munge.Client{Socket: d.Socket}
	ctx := context.Background()
	for b.Loop() {
		cred, err := c.Encode(ctx, benchPayload, munge.EncodeOptions{TTL: 60})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Decode(ctx, cred); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkJoinCredentialExec(b *testing.B) {
	d := mungetest.Start(b, mungetest.Options{Origin: "127.0.0.1"})
	for b.Loop() {
		enc := exec.Command("munge", "--socket", d.Socket, "--ttl", "60")
		enc.Stdin = strings.NewReader(string(benchPayload))
		cred, err := enc.Output()
		if err != nil {
			b.Fatal(err)
		}
		dec := exec.Command("unmunge", "--socket", d.Socket, "--metadata=/dev/null")
		dec.Stdin = strings.NewReader(string(cred))
		if out, err := dec.Output(); err != nil || !strings.HasPrefix(string(out), "airlock-join/1") {
			b.Fatalf("unmunge: %v %q", err, out)
		}
	}
}
