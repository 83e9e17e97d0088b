// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/test/topology"
)

// TestSiteFile runs jobs that set nothing but a site file, as a node's
// admin would write /etc/airlock/airlock.env: gateway and pin in a
// world-readable file, the token in a file only the users' group reads.
// It checks that the job joins with them, that --check says where each
// value came from, that the job's own settings win, and that a site file
// that would show every user of the node a token is refused.
func TestSiteFile(t *testing.T) {
	e := newEnv(t)
	dir := topology.TempDir(t)
	tokenFile := filepath.Join(dir, "token")
	writeFile(t, tokenFile, e.token+"\n", 0o640, 0, e.u.GID)
	site := filepath.Join(dir, "airlock.env")
	writeFile(t, site, fmt.Sprintf("# written by the site\nAIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\nAIRLOCK_TOKEN_FILE=%s\n", e.gateway, e.pin, tokenFile), 0o644, 0, 0)

	url := fmt.Sprintf("http://%s:%d/small", zoneName, e.httpPort)
	job := []string{"sh", "-c", "curl -sS --max-time 30 " + url + " | sha256sum"}
	runSite := func(t *testing.T, env []string, flags ...string) (int, string, string) {
		argv := append(append([]string{"env"}, env...), e.airlock, "run")
		argv = append(append(argv, flags...), "--")
		argv = append(argv, job...)
		return e.tp.Run(t, runTimeout, e.tp.CN, e.u, argv[0], argv[1:]...)
	}

	t.Run("Join", func(t *testing.T) {
		code, out, stderr := runSite(t, []string{"AIRLOCK_SITE_FILE=" + site})
		if code != 0 || !strings.HasPrefix(out, e.sha["small"]) {
			t.Fatalf("job with only a site file: exit %d, stdout %q, want 0 and the file's sha256%s", code, out, e.diag(stderr))
		}
	})
	t.Run("Check", func(t *testing.T) {
		argv := []string{e.airlock, "run", "--site-file", site, "--mode", "netns", "--check"}
		code, out, stderr := e.tp.Run(t, runTimeout, e.tp.CN, e.u, argv[0], argv[1:]...)
		for _, want := range []string{
			"--gateway: " + e.gateway + " from site file " + site + ":2",
			"--pin: " + e.pin + " from site file " + site + ":3",
			"--token-file: " + tokenFile + " from site file " + site + ":4",
			"--mode: netns from command line",
			"--site-file: " + site + " from command line",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("--check lacks %q:\n%s", want, out)
			}
		}
		if code != 0 || strings.Contains(out, e.token) {
			t.Errorf("--check: exit %d (want 0), or the token printed:\n%s%s", code, out, e.diag(stderr))
		}
	})
	t.Run("JobWins", func(t *testing.T) {
		// The job's own gateway keeps the site's pin away: with a wrong
		// gateway and no pin, the join cannot be tried.
		code, _, stderr := runSite(t, []string{"AIRLOCK_SITE_FILE=" + site, "AIRLOCK_GATEWAY=" + e.gateway, "AIRLOCK_TOKEN=" + e.token})
		if code != 125 || !strings.Contains(stderr, "pin") {
			t.Errorf("job's gateway without its pin: exit %d, want 125 and an error about the pin%s", code, e.diag(stderr))
		}
		// Its own gateway and pin, and its own token, win wholly.
		code, out, stderr := runSite(t, []string{"AIRLOCK_SITE_FILE=" + site, "AIRLOCK_TOKEN=" + e.token}, "--gateway", e.gateway, "--pin", e.pin)
		if code != 0 || !strings.HasPrefix(out, e.sha["small"]) {
			t.Errorf("job's own settings over the site file's: exit %d, stdout %q%s", code, out, e.diag(stderr))
		}
	})
	t.Run("TokenForEveryone", func(t *testing.T) {
		bad := filepath.Join(dir, "bad.env")
		writeFile(t, bad, fmt.Sprintf("AIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\nAIRLOCK_TOKEN=%s\n", e.gateway, e.pin, e.token), 0o644, 0, 0)
		code, _, stderr := runSite(t, []string{"AIRLOCK_SITE_FILE=" + bad})
		if code != 125 || !strings.Contains(stderr, "readable by every user of this node") || strings.Contains(stderr, e.token) {
			t.Errorf("world-readable site file with a token: exit %d, want 125 and the refusal without the token%s", code, e.diag(stderr))
		}
		worldToken := filepath.Join(dir, "world-token")
		writeFile(t, worldToken, e.token+"\n", 0o644, 0, 0)
		writeFile(t, bad, fmt.Sprintf("AIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\nAIRLOCK_TOKEN_FILE=%s\n", e.gateway, e.pin, worldToken), 0o644, 0, 0)
		code, _, stderr = runSite(t, []string{"AIRLOCK_SITE_FILE=" + bad})
		if code != 125 || !strings.Contains(stderr, "AIRLOCK_TOKEN_FILE="+worldToken+" is readable by every user") {
			t.Errorf("site file naming a world-readable token file: exit %d, want 125 and the refusal%s", code, e.diag(stderr))
		}
	})
	t.Run("NeighbourWritable", func(t *testing.T) {
		// A file the job's user owns but that is not root's is the
		// user's own; one another user could write is refused.
		bad := filepath.Join(dir, "writable.env")
		writeFile(t, bad, fmt.Sprintf("AIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\n", e.gateway, e.pin), 0o666, 0, 0)
		code, _, stderr := runSite(t, []string{"AIRLOCK_SITE_FILE=" + bad, "AIRLOCK_TOKEN=" + e.token})
		if code != 125 || !strings.Contains(stderr, "writable by every user of this node") {
			t.Errorf("world-writable site file: exit %d, want 125 and the refusal%s", code, e.diag(stderr))
		}
	})
}

// writeFile writes text to path with mode (past the umask), owned by
// uid:gid.
func writeFile(t *testing.T, path, text string, mode os.FileMode, uid, gid int) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, uid, gid); err != nil {
		t.Fatal(err)
	}
}
