// SPDX-License-Identifier: MIT

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestDiag gathers `airlock gateway diag` from a running gateway with a
// job, a token and a database URL with a password in its environment (as
// a fleet member's unit has), and checks that the archive holds status,
// check, version, metrics and profiles, and none of the token, the state
// directory's keys or the password.
func TestDiag(t *testing.T) {
	e := newEnv(t)
	job := e.start(t, "sleep", "30")
	defer job.Kill()
	if !topology.PollEvery(30*time.Second, 100*time.Millisecond, func() bool { return len(e.status(t).Jobs) != 0 }) {
		t.Fatalf("job did not join: %s", job.Describe())
	}
	// airlock status selects jobs by token on a real gateway.
	code, stdout, stderr := e.admin(t, "status", "--state", e.state, "--token", "e2e")
	if code != 0 || !strings.Contains(stdout, "jobs:       1, 1 of them selected") || strings.Count(stdout, " e2e ") != 1 {
		t.Errorf("status --token e2e: exit %d, %q %q; want the one job", code, stdout, stderr)
	}
	code, stdout, stderr = e.admin(t, "status", "--state", e.state, "--token", "nosuch", "--json")
	if code != 0 || !strings.Contains(stdout, `"jobs": null`) && !strings.Contains(stdout, `"jobs": []`) {
		t.Errorf("status --token nosuch --json: exit %d, %q %q; want no job", code, stdout, stderr)
	}
	const password = "diag-Secret-pw1"
	out := filepath.Join(filepath.Dir(e.state), "diag.tar.gz")
	code, stdout, stderr = e.tp.Run(t, 90*time.Second, e.tp.DMZ, e.gwUser, "env",
		"AIRLOCK_GATEWAY_STORE=postgres://airlock_gateway:"+password+"@127.0.0.1:1/airlock?sslmode=disable",
		"PGPASSWORD="+password, e.airlock, "gateway", "diag", "--state", e.state, "--output", out, "--profile-seconds", "1")
	if code != 0 {
		t.Fatalf("airlock gateway diag: exit %d, %q %q", code, stdout, stderr)
	}
	files := readTarGz(t, out)
	for _, name := range []string{"version.json", "status.json", "check.txt", "metrics.txt", "pprof/goroutine.txt", "pprof/heap.pb.gz", "pprof/cpu.pb.gz"} {
		if len(files["airlock-diag/"+name]) == 0 {
			t.Errorf("archive lacks %s (has %v)", name, keysOf(files))
		}
	}
	if m := string(files["airlock-diag/metrics.txt"]); !strings.Contains(m, "airlock_jobs 1") {
		t.Errorf("metrics.txt lacks airlock_jobs 1:\n%.2000s", m)
	}
	if s := string(files["airlock-diag/check.txt"]); !strings.Contains(s, "fleet database") {
		t.Errorf("check.txt does not check the database of AIRLOCK_GATEWAY_STORE:\n%s", s)
	}

	// Secrets: the token, the password, every key of the state directory.
	secrets := map[string][]byte{"the join token": []byte(e.token), "the database password": []byte(password)}
	entries, err := os.ReadDir(e.state)
	if err != nil {
		t.Fatal(err)
	}
	for _, de := range entries {
		if n := de.Name(); de.Type().IsRegular() && (strings.Contains(n, "key") || strings.HasSuffix(n, ".pem")) {
			b, err := os.ReadFile(filepath.Join(e.state, n))
			if err != nil {
				t.Fatal(err)
			}
			if k := bytes.TrimSpace(b); len(k) >= 16 {
				secrets["state file "+n] = k
			}
		}
	}
	if len(secrets) < 3 {
		t.Errorf("found no key file in the state directory %v to look for", entries)
	}
	var all bytes.Buffer
	for _, b := range files {
		all.Write(b)
		if gz, err := gzip.NewReader(bytes.NewReader(b)); err == nil { // profiles
			io.Copy(&all, io.LimitReader(gz, 64<<20))
		}
	}
	for what, s := range secrets {
		if bytes.Contains(all.Bytes(), s) {
			t.Errorf("diag archive holds %s", what)
		}
	}
	if bytes.Contains(all.Bytes(), []byte("alk1_")) && !bytes.Contains(all.Bytes(), []byte("alk1_REDACTED")) {
		t.Errorf("diag archive holds something like a token")
	}
}

// readTarGz returns the regular files of a gzipped tar by name.
func readTarGz(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
