// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/version"
)

// newDiagCmd is `airlock gateway diag`: what a site attaches to a bug
// report, with no secret in it.
func newDiagCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "diag --output FILE",
		Short: "gather status, check, version, metrics and profiles of the running gateway into one archive, without secrets",
		Long: `Writes a gzipped tar for a bug report or a support request: the gateway's
version, its status (airlock status --json), airlock gateway --check run
with this environment (so with the service's AIRLOCK_GATEWAY_* settings),
its metrics (from the admin socket, with or without --metrics), its
goroutines, a heap profile and a CPU profile of --profile-seconds, and the
config file (--config, AIRLOCK_GATEWAY_CONFIG), which holds no secret.

It holds no secret: no key, certificate key, token, backup or database of
the state directory, no environment; passwords in database URLs
(postgres://USER:PASSWORD@…, password=…) and anything that looks like a
join token (alk1_…) in the text it gathers are replaced by REDACTED. It
does name jobs, users, nodes and token names, as airlock status does:
share it as you would that.`,
		Example: `  sudo -u airlock airlock gateway diag --output /tmp/airlock-diag.tar.gz`,
		Args:    noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	output := cmd.Flags().StringP("output", "o", "", "write the archive to `FILE` (created 0600; not over an existing file)")
	_ = cmd.MarkFlagFilename("output", "tar.gz")
	configFile := cmd.Flags().String("config", "", "the gateway's config `FILE`, to include")
	setEnv(cmd.Flags().Lookup("config"), "AIRLOCK_GATEWAY_CONFIG")
	profileSecs := cmd.Flags().Int("profile-seconds", 5, "length of the CPU profile; 0: none")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := needState(state); err != nil {
			return err
		}
		if *output == "" {
			return usagef("--output is empty: want the archive's file name")
		}
		if *profileSecs < 0 || *profileSecs > 120 {
			return usagef("--profile-seconds %d: want 0 to 120", *profileSecs)
		}
		f, err := os.OpenFile(*output, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("diag: %w", err)
		}
		err = writeDiag(cmd.Context(), f, state, *configFile, *profileSecs, stderr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			os.Remove(*output)
			return fmt.Errorf("diag: %w", err)
		}
		fmt.Fprintf(stdout, "wrote %s\n", *output)
		return nil
	}
	return cmd
}

// secretPatterns match what must not leave in a diag archive, with the
// part to keep as $1.
var secretPatterns = []*regexp.Regexp{
	regexp.MustCompile(`(://[^:/@\s"']+:)[^@\s"']+(@)`),                        // URL user:password@
	regexp.MustCompile(`((?i:password|passwd|pgpassword)\s*[=:]\s*)[^\s"'&]+`), // password=…
	regexp.MustCompile(`(alk1_)[A-Za-z0-9_-]+`),                                // join tokens
}

// redact removes secrets from text.
func redact(b []byte) []byte {
	for _, re := range secretPatterns {
		b = re.ReplaceAll(b, []byte("${1}REDACTED${2}"))
	}
	return b
}

// writeDiag writes the archive into w. A part that cannot be gathered is
// recorded in errors.txt rather than failing the whole archive.
func writeDiag(ctx context.Context, w io.Writer, state, configFile string, profileSecs int, stderr io.Writer) error {
	zw := gzip.NewWriter(w)
	a := &diagArchive{tw: tar.NewWriter(zw), now: time.Now()}
	var buf bytes.Buffer
	if err := printJSON(&buf, version.Get()); err != nil {
		return err
	}
	if err := a.add("version.json", buf.Bytes(), true); err != nil {
		return err
	}
	if err := a.addGateway(ctx, state, profileSecs); err != nil {
		return err
	}
	if err := a.addCheck(ctx, state); err != nil {
		return err
	}
	if configFile != "" {
		if b, err := os.ReadFile(configFile); err != nil {
			fmt.Fprintf(&a.problems, "config: %v\n", err)
		} else if err := a.add("config.toml", b, true); err != nil {
			return err
		}
	}
	if a.problems.Len() > 0 {
		fmt.Fprintf(stderr, "airlock: warning: diag: some parts are missing:\n%s", a.problems.Bytes())
		if err := a.add("errors.txt", a.problems.Bytes(), true); err != nil {
			return err
		}
	}
	if err := a.tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}

// diagArchive is the diag archive being written: its tar stream, the time
// its entries carry, and the parts that could not be gathered.
type diagArchive struct {
	tw       *tar.Writer
	now      time.Time
	problems bytes.Buffer
}

// add writes the entry name with data, redacted if text.
func (a *diagArchive) add(name string, data []byte, text bool) error {
	if text {
		data = redact(data)
	}
	hdr := &tar.Header{Name: "airlock-diag/" + name, Mode: 0o600, Size: int64(len(data)), ModTime: a.now, Typeflag: tar.TypeReg}
	if err := a.tw.WriteHeader(hdr); err != nil {
		return err
	}
	_, err := a.tw.Write(data)
	return err
}

// addGateway adds what the running gateway of state directory state says
// on its admin socket: status, metrics, goroutines, heap and, for
// profileSecs > 0, a CPU profile that long.
func (a *diagArchive) addGateway(ctx context.Context, state string, profileSecs int) error {
	c, err := admin.Dial(state)
	if err != nil {
		fmt.Fprintf(&a.problems, "admin socket: %v\n", err)
		return nil
	}
	defer c.Close()
	parts := []struct {
		name, path string
		text       bool
	}{
		{"metrics.txt", admin.MetricsPath, true},
		{"pprof/goroutine.txt", "/debug/pprof/goroutine?debug=1", true},
		{"pprof/heap.pb.gz", "/debug/pprof/heap", false},
	}
	if profileSecs > 0 {
		parts = append(parts, struct {
			name, path string
			text       bool
		}{"pprof/cpu.pb.gz", "/debug/pprof/profile?seconds=" + strconv.Itoa(profileSecs), false})
	}
	var buf bytes.Buffer
	if st, err := c.Status(ctx); err != nil {
		fmt.Fprintf(&a.problems, "status: %v\n", err)
	} else {
		if err := printJSON(&buf, st); err != nil {
			return err
		}
		if err := a.add("status.json", buf.Bytes(), true); err != nil {
			return err
		}
	}
	for _, p := range parts {
		buf.Reset()
		if _, err := c.GetRaw(ctx, p.path, &buf); err != nil {
			fmt.Fprintf(&a.problems, "%s: %v\n", p.name, err)
			continue
		}
		if err := a.add(p.name, buf.Bytes(), p.text); err != nil {
			return err
		}
	}
	return nil
}

// addCheck adds the output of airlock gateway --check, as the service
// would run it: same binary, this environment.
func (a *diagArchive) addCheck(ctx context.Context, state string) error {
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(&a.problems, "check: %v\n", err)
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	chk := exec.CommandContext(cctx, exe, "gateway", "--check", "--state", state)
	out, err := chk.CombinedOutput()
	cancel()
	if err != nil {
		out = append(out, fmt.Sprintf("(airlock gateway --check: %v)\n", err)...)
	}
	return a.add("check.txt", out, true)
}
