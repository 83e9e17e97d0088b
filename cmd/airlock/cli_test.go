// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// airlock runs the command line args as main would.
func airlock(args ...string) (code int, stdout, stderr string) {
	var o, e bytes.Buffer
	code = run(args, &o, &e)
	return code, o.String(), e.String()
}

func TestCLIConventions(t *testing.T) {
	state := t.TempDir()
	if code, _, stderr := airlock("token", "create", "--state", state); code != 0 { // makes the state database
		t.Fatalf("token create: exit %d %s", code, stderr)
	}
	for _, tt := range []struct {
		args       []string
		code       int
		stdout     string // substrings that must appear
		stderr     string
		emptyOut   bool // nothing on stdout
		emptyError bool // nothing on stderr
	}{
		// Help on stdout, exit 0, for every spelling.
		{args: []string{"--help"}, stdout: "Available Commands:", emptyError: true},
		{args: []string{"help", "status"}, stdout: "airlock status [flags]", emptyError: true},
		{args: []string{"help", "gateway", "reload"}, stdout: "airlock gateway reload [flags]", emptyError: true},
		{args: []string{"status", "-h"}, stdout: "--json", emptyError: true},
		{args: []string{"token", "list", "--help"}, stdout: "--state DIR", emptyError: true},
		{args: []string{"gateway", "--help"}, stdout: "--egress-prefix", emptyError: true},
		// Flags print with two dashes, and say where else they are read.
		{args: []string{"run", "--help"}, stdout: "--token-file FILE", emptyError: true},
		{args: []string{"run", "--help"}, stdout: "(env AIRLOCK_TOKEN_FILE)", emptyError: true},
		{args: []string{"gateway", "--help"}, stdout: "(env AIRLOCK_GATEWAY_STATE, AIRLOCK_STATE) (default \"/var/lib/airlock\")"},
		{args: []string{"whois", "--help"}, stdout: "(env AIRLOCK_STATE)"},
		// Versions.
		{args: []string{"--version"}, stdout: "airlock ", emptyError: true},
		{args: []string{"version"}, stdout: "version:", emptyError: true},
		// Mistakes: a message naming the mistake and the help, exit 2.
		{args: []string{"gatway"}, code: exitUsage, stderr: `unknown command "gatway" for "airlock"; did you mean gateway?`, emptyOut: true},
		{args: []string{"gateway", "relaod"}, code: exitUsage, stderr: `unknown command "relaod" for "airlock gateway"; did you mean reload?`, emptyOut: true},
		{args: []string{"token"}, code: exitUsage, stderr: "missing subcommand: want one of create, list, restrict, revoke", emptyOut: true},
		{args: []string{}, code: exitUsage, stderr: "missing subcommand", emptyOut: true},
		{args: []string{"status", "--bogus"}, code: exitUsage, stderr: "unknown flag: --bogus\nRun 'airlock status --help' for usage.", emptyOut: true},
		{args: []string{"status", "extra"}, code: exitUsage, stderr: `unexpected arguments ["extra"]`, emptyOut: true},
		{args: []string{"kick"}, code: exitUsage, stderr: "want one JOB", emptyOut: true},
		{args: []string{"token", "revoke", "a", "b"}, code: exitUsage, stderr: "want one token NAME, got 2 arguments"},
		{args: []string{"whois", "--state", state, "--at", "yesterday", "192.0.2.1:1"}, code: exitUsage, stderr: `bad --at "yesterday"`},
		// airlock run's own failures, bad flags included, are 125.
		{args: []string{"run", "--bogus", "--", "true"}, code: 125, stderr: "unknown flag: --bogus"},
		// An admin command without a running gateway says how to start it.
		{args: []string{"status", "--state", state}, code: exitFailure, stderr: "no gateway running: start it with airlock gateway --state " + state},
		// whois with no match fails in text and in JSON alike.
		{args: []string{"whois", "--state", state, "192.0.2.1:20000"}, code: exitFailure, stderr: "whois: no lease held 192.0.2.1:20000", emptyOut: true},
		{args: []string{"whois", "--state", state, "--json", "192.0.2.1:20000"}, code: exitFailure, stdout: "[]", stderr: "no lease held"},
		// Flags after arguments work where the command takes arguments.
		{args: []string{"whois", "192.0.2.1:20000", "--state", state, "--json"}, code: exitFailure, stdout: "[]"},
		// Single-dash long flags, as Go's flag package took them, still
		// work, with a warning.
		{args: []string{"status", "-state", state, "-json"}, code: exitFailure, stderr: "warning: read -state, -json as --state, --json"},
		{args: []string{"whois", "-state=" + state, "192.0.2.1:20000"}, code: exitFailure, stderr: "no lease held"},
	} {
		code, stdout, stderr := airlock(tt.args...)
		if code != tt.code {
			t.Errorf("airlock %q: exit %d, want %d\nstdout: %s\nstderr: %s", tt.args, code, tt.code, stdout, stderr)
		}
		if !strings.Contains(stdout, tt.stdout) {
			t.Errorf("airlock %q: stdout lacks %q:\n%s", tt.args, tt.stdout, stdout)
		}
		if !strings.Contains(stderr, tt.stderr) {
			t.Errorf("airlock %q: stderr lacks %q:\n%s", tt.args, tt.stderr, stderr)
		}
		if tt.emptyOut && stdout != "" {
			t.Errorf("airlock %q: stdout %q, want none", tt.args, stdout)
		}
		if tt.emptyError && stderr != "" {
			t.Errorf("airlock %q: stderr %q, want none", tt.args, stderr)
		}
	}
}

func TestEnvironmentFlags(t *testing.T) {
	// run reads AIRLOCK_<FLAG>; a bad --mode stops it before it joins.
	t.Setenv("AIRLOCK_MODE", "socks")
	code, _, stderr := airlock("run", "--gateway", "gw.example:8443", "--pin", "sha256:00", "--token", "t", "--", "true")
	if code != 125 || !strings.Contains(stderr, `bad --mode "socks"`) {
		t.Errorf("AIRLOCK_MODE=socks: exit %d, %q; want 125 and the bad mode", code, stderr)
	}
	// The command line wins over the environment.
	code, _, stderr = airlock("run", "--mode", "bogus", "--gateway", "gw.example:8443", "--pin", "sha256:00", "--token", "t", "--", "true")
	if code != 125 || !strings.Contains(stderr, `bad --mode "bogus"`) {
		t.Errorf("--mode bogus with AIRLOCK_MODE=socks: exit %d, %q; want the flag's value", code, stderr)
	}
	// A value the flag cannot take is a usage error naming the variable.
	t.Setenv("AIRLOCK_JOIN_TIMEOUT", "soon")
	code, _, stderr = airlock("run", "--", "true")
	if code != 125 || !strings.Contains(stderr, `bad AIRLOCK_JOIN_TIMEOUT="soon" (for --join-timeout)`) {
		t.Errorf("AIRLOCK_JOIN_TIMEOUT=soon: exit %d, %q", code, stderr)
	}
	// The gateway reads AIRLOCK_GATEWAY_<FLAG>; its --state falls back to
	// AIRLOCK_STATE, which every admin command reads.
	state := t.TempDir()
	t.Setenv("AIRLOCK_STATE", state)
	if code, stdout, stderr := airlock("token", "create", "--name", "envtok"); code != 0 || len(strings.TrimSpace(stdout)) < 20 {
		t.Fatalf("token create with AIRLOCK_STATE: exit %d, %q %q", code, stdout, stderr)
	}
	code, stdout, stderr := airlock("token", "list", "--json")
	var toks []map[string]any
	if err := json.Unmarshal([]byte(stdout), &toks); code != 0 || err != nil || len(toks) != 1 || toks[0]["name"] != "envtok" {
		t.Errorf("token list --json with AIRLOCK_STATE: exit %d, %v, %q %q", code, err, stdout, stderr)
	}
	if _, ok := toks[0]["hash"]; ok || toks[0]["expires"] != nil {
		t.Errorf("token list --json: %v; want no hash and a null expiry", toks[0])
	}
	t.Setenv("AIRLOCK_GATEWAY_SUBNET", "not-a-prefix")
	code, _, stderr = airlock("gateway", "--check")
	if code != exitFailure || !strings.Contains(stderr, "bad --subnet") {
		t.Errorf("AIRLOCK_GATEWAY_SUBNET=not-a-prefix: exit %d, %q", code, stderr)
	}
}

func TestTokenCreateJSON(t *testing.T) {
	state := t.TempDir()
	code, stdout, stderr := airlock("token", "create", "--state", state, "--name", "j", "--ttl", "1h", "--json")
	var tok struct {
		Name, Token     string
		Created, Expire any
		Expires         *string
	}
	if err := json.Unmarshal([]byte(stdout), &tok); code != 0 || err != nil || tok.Name != "j" || len(tok.Token) < 20 || tok.Expires == nil {
		t.Errorf("token create --json: exit %d, %v, %q %q", code, err, stdout, stderr)
	}
}

func TestLongFlagsCompat(t *testing.T) {
	root := newRoot(&bytes.Buffer{}, &bytes.Buffer{})
	for _, tt := range []struct{ in, want string }{
		{"status -state D -json", "status --state D --json"},
		{"status --state -json", "status --state -json"}, // -json is --state's value
		{"gateway reload -state=D", "gateway reload --state=D"},
		// run's flags end at the job's command: its arguments are its own.
		{"run -mode auto find . -name x", "run --mode auto find . -name x"},
		{"run -- find -name x", "run -- find -name x"},
		{"run --token-file F sh -c 'exit 3'", "run --token-file F sh -c 'exit 3'"},
		// One-letter flags and words that name no flag stay.
		{"capture 4242 -w F -c 3 tcp", "capture 4242 -w F -c 3 tcp"},
		{"capture -buffer 9 4242 -w F", "capture --buffer 9 4242 -w F"},
		{"status -nosuch", "status -nosuch"},
		{"-help", "--help"},
		{"-version", "--version"},
	} {
		var w bytes.Buffer
		got := strings.Join(longFlagsCompat(root, strings.Fields(tt.in), &w), " ")
		if got != tt.want {
			t.Errorf("%q: got %q, want %q", tt.in, got, tt.want)
		}
		if (got != tt.in) != strings.Contains(w.String(), "warning") {
			t.Errorf("%q: warning %q", tt.in, w.String())
		}
	}
}

func TestCheckJSON(t *testing.T) {
	// No gateway given: a problem, in JSON too, and exit 1.
	code, stdout, stderr := airlock("run", "--check", "--json", "--mode", "proxy")
	var rep checkJSON
	if err := json.Unmarshal([]byte(stdout), &rep); err != nil || code != exitFailure || rep.Problems == 0 {
		t.Fatalf("run --check --json: exit %d, %v\n%s\n%s", code, err, stdout, stderr)
	}
	last := rep.Checks[len(rep.Checks)-1]
	if last.Name != "gateway" || last.Status != "problem" || last.Fix == "" {
		t.Errorf("run --check --json: last check %+v, want the missing gateway", last)
	}
	// A token file is what the check joins with (not "no token").
	code, stdout, _ = airlock("run", "--check", "--mode", "proxy", "--token-file", "/nonexistent/token", "--gateway", "127.0.0.1:1", "--pin", "sha256:00")
	if code != exitFailure || !strings.Contains(stdout, "PROBLEM join token: token file: open /nonexistent/token") {
		t.Errorf("run --check --token-file /nonexistent/token: exit %d\n%s", code, stdout)
	}
}

// BenchmarkVersion is the command line's own cost on every airlock start
// (airlock run included): building every command and flag, parsing the
// arguments, running a trivial command.
func BenchmarkVersion(b *testing.B) {
	var o, e bytes.Buffer
	for b.Loop() {
		o.Reset()
		if code := run([]string{"version", "--json"}, &o, &e); code != 0 {
			b.Fatal(e.String())
		}
	}
}

// TestTokenCreateNoTTLWarns: a token without --ttl never expires, and
// create says so on stderr (stdout stays the bare secret); with --ttl no
// warning.
func TestTokenCreateNoTTLWarns(t *testing.T) {
	state := t.TempDir()
	code, stdout, stderr := airlock("token", "create", "--state", state, "--name", "forever")
	if code != 0 || strings.Contains(stdout, "warning") || !strings.Contains(stderr, "warning: token forever never expires") || !strings.Contains(stderr, "--ttl") {
		t.Errorf("token create without --ttl: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	code, _, stderr = airlock("token", "create", "--state", state, "--name", "month", "--ttl", "720h")
	if code != 0 || strings.Contains(stderr, "never expires") {
		t.Errorf("token create --ttl 720h: exit %d, stderr %q", code, stderr)
	}
}

// TestGatewayEnvFile: --env-file reads the service's settings file as
// systemd does (file over environment, command line over both) and, as
// the packaged unit, requires the listen address in it.
func TestGatewayEnvFile(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		f := filepath.Join(dir, "airlock-gateway")
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return f
	}
	state := filepath.Join(dir, "state")
	f := write("# the admin's\nAIRLOCK_GATEWAY_LISTEN=127.0.0.1:18443\nAIRLOCK_GATEWAY_STATE=" + state + "\n")
	t.Setenv("AIRLOCK_GATEWAY_LISTEN", "127.0.0.1:19999")
	_, out, errs := airlock("gateway", "--check", "--json", "--env-file", f)
	if !strings.Contains(out, "127.0.0.1:18443") || strings.Contains(out, "19999") || !strings.Contains(out, state) {
		t.Errorf("--check --env-file checks other settings than the file's:\n%s%s", out, errs)
	}
	_, out, _ = airlock("gateway", "--check", "--json", "--env-file", f, "--listen", "127.0.0.1:17777")
	if !strings.Contains(out, "127.0.0.1:17777") {
		t.Errorf("--listen on the command line does not win over --env-file:\n%s", out)
	}
	f = write("AIRLOCK_GATEWAY_LISTEN=\n")
	if code, _, errs := airlock("gateway", "--check", "--env-file", f); code != 2 || !strings.Contains(errs, "sets no AIRLOCK_GATEWAY_LISTEN") {
		t.Errorf("--env-file without the listen address: exit %d, %s", code, errs)
	}
	f = write("AIRLOCK_GATEWAY_LISTEN=127.0.0.1:18443\nAIRLOCK_GATEWAY_MTU=big\n")
	if code, _, errs := airlock("gateway", "--check", "--env-file", f); code == 0 || !strings.Contains(errs, "AIRLOCK_GATEWAY_MTU") || !strings.Contains(errs, f) {
		t.Errorf("--env-file with a bad value: exit %d, %s", code, errs)
	}
	if code, _, errs := airlock("gateway", "--check", "--env-file", filepath.Join(dir, "missing")); code == 0 || !strings.Contains(errs, "missing") {
		t.Errorf("--env-file of a missing file: exit %d, %s", code, errs)
	}
}
