// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPolicyExplain(t *testing.T) {
	example := filepath.Join("..", "..", "docs", "gateway.example.toml")
	var stdout, stderr bytes.Buffer
	code := run([]string{"policy", "explain", "--config", example, "--token", "cms-pilots", "10.20.1.5:1094", "[2001:db8:42::1]:443"}, &stdout, &stderr)
	out := stdout.String()
	for _, want := range []string{
		`tcp 10.20.1.5:1094 for token "cms-pilots": allow by rule "cms-storage" (` + example + `:`,
		`rule "no-smtp" does not match: port 1094 is not in 25,465,587`,
		`tcp [2001:db8:42::1]:443 for token "cms-pilots": deny by rule "no-batch-net"`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("explain lacks %q:\n%s", want, out)
		}
	}
	if code != 0 || stderr.Len() != 0 {
		t.Errorf("exit %d, stderr %q; want 0 and nothing", code, stderr.String())
	}

	// A file whose policy tests fail: explained, then refused (exit 1).
	b, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	failing := filepath.Join(t.TempDir(), "gw.toml")
	if err := os.WriteFile(failing, []byte(strings.Replace(string(b), "token = \"cms-pilots\"\nallow", "token = \"atlas\"\nallow", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	code = run([]string{"policy", "explain", "--config", failing, "--proto", "icmp", "198.51.100.7"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stdout.String(), "icmp 198.51.100.7 for a token no rule names: allow by the default") ||
		!strings.Contains(stderr.String(), "the gateway would refuse "+failing) || !strings.Contains(stderr.String(), `policy.test[1].allow: tcp to 10.20.1.5:1094 for token "atlas"`) {
		t.Errorf("failing tests: exit %d, stdout %q, stderr %q; want the explanation, then the refusal and exit 1", code, stdout.String(), stderr.String())
	}
	stderr.Reset()
	if code := run([]string{"policy", "explain", "--config", example, "10.20.1.5"}, &stdout, &stderr); code != exitUsage || !strings.Contains(stderr.String(), "want HOST:PORT") {
		t.Errorf("tcp without a port: exit %d, stderr %q; want a usage error", code, stderr.String())
	}
}
