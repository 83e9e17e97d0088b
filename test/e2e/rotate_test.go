// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestKeyRotation rotates the gateway's TLS key as docs/operations.md
// says, with jobs running and joining throughout: a job that knows only
// the old pin keeps its traffic flowing, jobs given the new pin, both pins
// or the old pin join while the rotation is under way, and after
// --finish only the new pin works, also across a restart.
func TestKeyRotation(t *testing.T) {
	const metricsPort = 8446 // in dmz's own network namespace
	e := newEnvMode(t, modeUser, "--renew-interval", "2s", "--metrics", fmt.Sprintf("127.0.0.1:%d", metricsPort))
	oldPin := e.pin
	url := fmt.Sprintf("http://%s:%d/small", e.tp.INETAddr, e.httpPort)
	fetch := []string{"curl", "-sS", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}\n", url}

	// A job with the old pin only, fetching every half second across the
	// whole rotation, one line per fetch.
	stopDir := topology.TempDir(t)
	if err := os.Chmod(stopDir, 0o755); err != nil { // the job's user looks for the file
		t.Fatal(err)
	}
	stop := filepath.Join(stopDir, "stop")
	loop := fmt.Sprintf(`while [ ! -e %[1]s ]; do if curl -sS --max-time 5 -o /dev/null %[2]s; then echo ok; else echo bad; fi; sleep 0.5; done`, stop, url)
	long := e.startWith(t, runOpts{pin: oldPin, env: []string{"AIRLOCK_JOB_ID=rotate-long"}}, "sh", "-c", loop)
	defer long.Kill()

	rotate := func(args ...string) (string, string) {
		t.Helper()
		code, out, stderr := e.admin(t, append([]string{"gateway", "rotate-key", "--state", e.state}, args...)...)
		if code != 0 {
			t.Fatalf("airlock gateway rotate-key %v: exit %d %s %s%s", args, code, out, stderr, e.diag(""))
		}
		return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(out), "AIRLOCK_PIN=")), stderr
	}
	joinEnvPin := func() string {
		vals, err := readEnvFile(filepath.Join(e.state, "join.env"))
		if err != nil {
			t.Fatal(err)
		}
		return vals["AIRLOCK_PIN"]
	}
	job := func(name, pin string) (int, string) {
		t.Helper()
		code, out, stderr := e.runWith(t, runOpts{pin: pin, env: []string{"AIRLOCK_JOB_ID=" + name}}, fetch...)
		return code, strings.TrimSpace(out) + stderr
	}

	// fetches returns the long job's results so far, waiting until it has
	// at least n.
	fetches := func(n int) []string {
		t.Helper()
		var lines []string
		if !topology.Poll(30*time.Second, func() bool { lines = strings.Fields(long.Stdout()); return len(lines) >= n }) {
			t.Fatalf("the long job made %d fetches, want %d%s", len(lines), n, e.diag(long.Stderr()))
		}
		return lines
	}
	before := len(fetches(1))

	// Step 1: the next key, served to clients that name it.
	pins, _ := rotate()
	newPin, cur, ok := strings.Cut(pins, ",")
	if !ok || cur != oldPin || newPin == oldPin || !strings.HasPrefix(newPin, "sha256:") {
		t.Fatalf("rotate-key printed AIRLOCK_PIN=%s, want NEW,%s", pins, oldPin)
	}
	if got := joinEnvPin(); got != pins {
		t.Errorf("join.env AIRLOCK_PIN=%s during the rotation, want %s", got, pins)
	}
	if code, _, stderr := e.admin(t, "gateway", "rotate-key", "--state", e.state); code != 1 || !strings.Contains(stderr, "under way already") {
		t.Errorf("a second rotate-key: exit %d %q, want 1 and a rotation under way", code, stderr)
	}
	for _, c := range []struct{ name, pin string }{
		{"rotate-both", pins},                      // the new join.env
		{"rotate-both-bar", oldPin + "|" + newPin}, // either order, either separator
		{"rotate-new", newPin},                     // a node given only the new pin early
		{"rotate-old", oldPin},                     // a node not updated yet
	} {
		if code, out := job(c.name, c.pin); code != 0 || !strings.HasPrefix(out, "200") {
			t.Errorf("job %s (AIRLOCK_PIN=%s) during the rotation: exit %d %s", c.name, c.pin, code, out)
		}
	}
	if st := e.status(t); st.Pin != oldPin || st.NextPin != newPin {
		t.Errorf("airlock status during the rotation: pin %s next %s, want %s and %s", st.Pin, st.NextPin, oldPin, newPin)
	}
	m := e.metrics(t, metricsPort)
	if next, cur := m[`airlock_tls_handshakes_total{identity="next"}`], m[`airlock_tls_handshakes_total{identity="current"}`]; next < 3 || cur < 1 {
		t.Errorf("airlock_tls_handshakes_total during the rotation: next %v, current %v; want next >= 3, current >= 1", next, cur)
	}

	// The long job, with the old pin only, keeps working while the
	// gateway holds both keys, across several of its renewals (every 2 s).
	time.Sleep(5 * time.Second)
	got := fetches(before + 4)
	for i, r := range got {
		if r != "ok" {
			t.Errorf("the long job's fetch %d (of %d; the rotation began after %d): %s%s", i+1, len(got), before, r, e.diag(long.Stderr()))
			break
		}
	}

	// Step 2: finish. The old pin is refused, with the fix named.
	if got, _ := rotate("--finish"); got != newPin {
		t.Fatalf("rotate-key --finish printed AIRLOCK_PIN=%s, want %s", got, newPin)
	}
	if got := joinEnvPin(); got != newPin {
		t.Errorf("join.env AIRLOCK_PIN=%s after the rotation, want %s", got, newPin)
	}
	if st := e.status(t); st.Pin != newPin || st.NextPin != "" {
		t.Errorf("airlock status after --finish: pin %s next %q, want %s alone", st.Pin, st.NextPin, newPin)
	}
	if code, out := job("rotate-old-after", oldPin); code != 125 || !strings.Contains(out, "presented fingerprint "+newPin) {
		t.Errorf("job with the old pin after --finish: exit %d %s, want 125 and a pin mismatch naming %s", code, out, newPin)
	}
	for _, pin := range []string{newPin, pins} {
		if code, out := job("rotate-after", pin); code != 0 || !strings.HasPrefix(out, "200") {
			t.Errorf("job with AIRLOCK_PIN=%s after --finish: exit %d %s", pin, code, out)
		}
	}

	// The long job may lose its lease now (its next TLS handshake fails
	// the old pin): that is what --finish means.
	if err := os.WriteFile(stop, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	long.Kill()

	// A restart keeps the new key.
	e.gw.Kill()
	e.startGateway(t)
	if e.pin != newPin {
		t.Errorf("after a restart join.env AIRLOCK_PIN=%s, want %s", e.pin, newPin)
	}
	if code, out := job("rotate-restart", newPin); code != 0 || !strings.HasPrefix(out, "200") {
		t.Errorf("job with the new pin after a restart: exit %d %s", code, out)
	}
}
