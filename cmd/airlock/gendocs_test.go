// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite docs/man and docs/cli from the command definitions (make docs)")

// Where the generated pages live, from this package's directory.
const (
	manDir = "../../docs/man"
	cliDir = "../../docs/cli"
)

// thDate is the date field of a man page's .TH line: the month the page
// last changed, kept when a regeneration changes nothing else.
var thDate = regexp.MustCompile(`(?m)^(\.TH "[^"]*" "[^"]*") "[^"]*"`)

// genDocs writes the man pages and the Markdown reference of root's tree
// into man and md.
func genDocs(t *testing.T, root *cobra.Command, man, md string) {
	t.Helper()
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		c.DisableAutoGenTag = true
		c.Long = markdownText(c.Long)
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	header := &doc.GenManHeader{Source: "Airlock", Manual: "Airlock Manual"}
	if err := doc.GenManTree(root, header, man); err != nil {
		t.Fatal(err)
	}
	manSections(t, root, man)
	if err := doc.GenMarkdownTree(root, md); err != nil {
		t.Fatal(err)
	}
}

// manSections adds to every page in dir the sections cobra does not write
// (EXIT STATUS, ENVIRONMENT, FILES: manPageSections) and moves the
// gateway's pages, system administration commands, to section 8.
func manSections(t *testing.T, root *cobra.Command, dir string) {
	t.Helper()
	var cmds []*cobra.Command
	var walk func(*cobra.Command)
	walk = func(c *cobra.Command) {
		if c.IsAvailableCommand() || c == root {
			cmds = append(cmds, c)
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	ref := regexp.MustCompile(`\\fB(airlock-gateway[a-z-]*)\(1\)\\fP`)
	for _, c := range cmds {
		base := strings.ReplaceAll(c.CommandPath(), " ", "-")
		old := filepath.Join(dir, base+".1")
		b, err := os.ReadFile(old)
		if err != nil {
			t.Fatal(err)
		}
		page := string(b)
		extra := manPageSections(c)
		if i := strings.Index(page, ".SH SEE ALSO"); i >= 0 {
			page = page[:i] + extra + page[i:]
		} else {
			page += extra
		}
		page = ref.ReplaceAllString(page, `\fB$1(8)\fP`)
		name := old
		if gatewaySection(c) {
			page = strings.Replace(page, `.TH "`+strings.ToUpper(base)+`" "1"`, `.TH "`+strings.ToUpper(base)+`" "8"`, 1)
			name = filepath.Join(dir, base+".8")
			if err := os.Remove(old); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(name, []byte(page), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// markdownText escapes what Markdown would read as markup in a help text
// written as plain text (AIRLOCK_TOKEN ... AIRLOCK_ is no emphasis),
// leaving code blocks (lines indented by four spaces) as they are.
func markdownText(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if !strings.HasPrefix(l, "    ") {
			lines[i] = strings.NewReplacer(`\`, `\\`, "_", `\_`, "*", `\*`, "<", `\<`, "`", "\\`").Replace(l)
		}
	}
	return strings.Join(lines, "\n")
}

// docsRoot is the command tree as the pages describe it: with the
// completion command that cobra adds when it runs.
func docsRoot() *cobra.Command {
	root := newRoot(io.Discard, io.Discard)
	root.InitDefaultCompletionCmd()
	return root
}

// TestGeneratedDocs fails when docs/man or docs/cli differ from what the
// command definitions make; `make docs` (go test -run TestGeneratedDocs
// -update) rewrites them.
func TestGeneratedDocs(t *testing.T) {
	man, md := t.TempDir(), t.TempDir()
	genDocs(t, docsRoot(), man, md)
	for _, d := range []struct {
		gen, repo string
		norm      func([]byte) []byte
	}{
		{man, manDir, func(b []byte) []byte { return thDate.ReplaceAll(b, []byte(`$1 ""`)) }},
		{md, cliDir, func(b []byte) []byte { return b }},
	} {
		if *update {
			sync(t, d.gen, d.repo, d.norm)
			continue
		}
		gen, repo := readDir(t, d.gen), readDir(t, d.repo)
		for name, b := range gen {
			old, ok := repo[name]
			switch {
			case !ok:
				t.Errorf("%s/%s is missing: run make docs", d.repo, name)
			case !bytes.Equal(d.norm(old), d.norm(b)):
				t.Errorf("%s/%s is stale: run make docs", d.repo, name)
			}
		}
		for name := range repo {
			if _, ok := gen[name]; !ok && !handWritten(name) {
				t.Errorf("%s/%s describes no command: run make docs", d.repo, name)
			}
		}
	}
}

// sync makes dir hold exactly gen's files, keeping a file whose
// normalised content is unchanged (and so its date).
func sync(t *testing.T, gen, dir string, norm func([]byte) []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	newFiles, old := readDir(t, gen), readDir(t, dir)
	for name := range old {
		if _, ok := newFiles[name]; !ok && !handWritten(name) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, b := range newFiles {
		if o, ok := old[name]; ok && bytes.Equal(norm(o), norm(b)) {
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s/%s", dir, name)
	}
}

func readDir(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = b
	}
	return out
}

// TestManPagesRender runs every man page through man's own formatter,
// which must not warn.
func TestManPagesRender(t *testing.T) {
	groff, err := exec.LookPath("groff")
	if err != nil {
		t.Skip("groff not installed (man-db's formatter)")
	}
	pages, _ := filepath.Glob(filepath.Join(manDir, "*.[158]"))
	if len(pages) < 10 {
		t.Fatalf("only %d man pages in %s", len(pages), manDir)
	}
	for _, p := range pages {
		out, err := exec.Command(groff, "-k", "-man", "-Tutf8", "-ww", "-z", p).CombinedOutput()
		if err != nil || len(out) > 0 {
			t.Errorf("groff -k -man %s: %v\n%s", p, err, out)
		}
	}
}

// TestCompletion generates each shell's completion script, has the shell
// parse it where it is installed, and asks the completion engine the
// scripts call for flags and values.
func TestCompletion(t *testing.T) {
	if code, _, _ := airlock("completion", "powershell"); code == 0 {
		t.Error("completion powershell: exit 0, want no PowerShell script from a Linux-only tool")
	}
	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, script, stderr := airlock("completion", sh)
		if code != 0 || !strings.Contains(script, "__complete") {
			t.Errorf("completion %s: exit %d, %d bytes %s", sh, code, len(script), stderr)
			continue
		}
		bin, err := exec.LookPath(sh)
		if err != nil {
			t.Logf("%s not installed: its script is not parsed", sh)
			continue
		}
		f := filepath.Join(t.TempDir(), "airlock."+sh)
		if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(bin, "-n", f).CombinedOutput(); err != nil {
			t.Errorf("%s -n on its completion script: %v\n%s", sh, err, out)
		}
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"gat"}, []string{"gateway"}},
		{[]string{"gateway", "--egress-p"}, []string{"--egress-ports", "--egress-prefix"}},
		{[]string{"gateway", ""}, []string{"drain", "reload"}},
		{[]string{"run", "--mode", ""}, []string{"auto", "netns", "seccomp", "preload", "proxy"}},
		{[]string{"token", "list", "--j"}, []string{"--json"}},
	} {
		_, out, _ := airlock(append([]string{"__complete"}, tt.args...)...)
		for _, w := range tt.want {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(w) + `(\t|$)`).MatchString(out) {
				t.Errorf("complete %q: no %q in\n%s", tt.args, w, out)
			}
		}
	}
}

// gatewaySection reports whether c's page belongs in section 8 (system
// administration: the gateway and its subcommands).
func gatewaySection(c *cobra.Command) bool {
	return c.CommandPath() == "airlock gateway" || strings.HasPrefix(c.CommandPath(), "airlock gateway ")
}

// handWritten are the pages in docs/man that no command makes: the config
// file's (section 5).
func handWritten(name string) bool { return strings.HasSuffix(name, ".5") }

// manPageSections returns the EXIT STATUS, ENVIRONMENT and FILES sections
// of c's man page, in roff.
func manPageSections(c *cobra.Command) string {
	var b strings.Builder
	path := c.CommandPath()
	b.WriteString(".SH EXIT STATUS\n.PP\n")
	switch {
	case path == "airlock run":
		b.WriteString("The job's exit status; 128+N if signal N killed it; 125 if airlock itself failed (bad flags included); 126 if the job's command is not executable; 127 if it was not found. With \\fB--check\\fP: 0 if nothing is a problem, 1 if something is.\n")
	case path == "airlock whois":
		b.WriteString("0 if a lease was found; 1 if none was or the command failed; 2 on a bad command line.\n")
	case c.Flags().Lookup("check") != nil:
		b.WriteString("0 on success; 1 if the command failed or \\fB--check\\fP found a problem; 2 on a bad command line (unknown flag, bad value, wrong arguments).\n")
	default:
		b.WriteString("0 on success; 1 if the command failed; 2 on a bad command line (unknown command or flag, bad value, wrong arguments).\n")
	}

	b.WriteString(".SH ENVIRONMENT\n")
	var envs []string
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if vs := f.Annotations[envAnnotation]; len(vs) > 0 {
			envs = append(envs, fmt.Sprintf(".TP\n\\fB%s\\fP\nfor \\fB--%s\\fP", strings.Join(vs, "\\fP, \\fB"), f.Name))
		}
	})
	if len(envs) == 0 {
		b.WriteString(".PP\nNone of its own.\n")
	} else {
		b.WriteString(".PP\nEach flag is read from these variables, the first one set and not empty, when the command line does not set it.\n")
		b.WriteString(strings.ReplaceAll(strings.Join(envs, "\n"), "_", "\\_") + "\n")
	}
	if path == "airlock gateway" {
		b.WriteString(".TP\n\\fBNOTIFY\\_SOCKET\\fP, \\fBJOURNAL\\_STREAM\\fP\nset by systemd: the gateway reports READY=1, RELOADING=1 and STOPPING=1 (Type=notify), and prefixes each log line with its syslog priority when its output is the journal\n")
	}

	b.WriteString(".SH FILES\n")
	files := []string{}
	gw := func() {
		files = append(files,
			"/etc/default/airlock-gateway, /etc/sysconfig/airlock-gateway", "the packaged service's settings (Debian; EL), one AIRLOCK_GATEWAY_<FLAG>=VALUE a line; read by --env-file",
			"/etc/airlock/gateway.toml", "the config file of --config, see airlock-gateway.toml(5)",
			"/usr/lib/systemd/system/airlock-gateway.service", "the packaged service")
	}
	state := func() {
		files = append(files,
			"/var/lib/airlock", "the gateway's state directory (--state, 0700): keys, certificate, tokens, leases, attribution history",
			"/var/lib/airlock/admin.sock", "the admin socket that admin commands use while the gateway runs",
			"/var/lib/airlock/join.env", "AIRLOCK_GATEWAY and AIRLOCK_PIN for the nodes, written at every start")
	}
	switch {
	case path == "airlock":
		gw()
		state()
		files = append(files, "/etc/apparmor.d/airlock", "the AppArmor profile that allows airlock user namespaces where they are restricted (Ubuntu 24.04)")
	case gatewaySection(c):
		gw()
		state()
		files = append(files, "/var/lib/airlock/flows.log", "the flow log (--flow-log)")
	case path == "airlock run":
		files = append(files,
			"/usr/lib/airlock/libairlock-preload.so", "the library of --mode preload (also next to the binary, or ../lib/airlock/ from it)",
			"/etc/apparmor.d/airlock", "the AppArmor profile that allows airlock user namespaces where they are restricted (Ubuntu 24.04); airlock run --check says whether it applies")
	case strings.HasPrefix(path, "airlock completion"), path == "airlock version":
	default:
		state()
	}
	if len(files) == 0 {
		b.WriteString(".PP\nNone.\n")
	}
	for i := 0; i < len(files); i += 2 {
		fmt.Fprintf(&b, ".TP\n\\fI%s\\fP\n%s\n", files[i], strings.ReplaceAll(files[i+1], "_", "\\_"))
	}
	return b.String()
}

// TestConfigManPage: the config file's page (section 5, written by hand)
// has the sections every page has, and its example loads.
func TestConfigManPage(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(manDir, "airlock-gateway.toml.5"))
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, sec := range []string{".SH NAME", ".SH SYNOPSIS", ".SH EXIT STATUS", ".SH ENVIRONMENT", ".SH FILES", ".SH SEE ALSO"} {
		if !strings.Contains(page, sec+"\n") {
			t.Errorf("airlock-gateway.toml.5 lacks %s", sec)
		}
	}
	ex := page[strings.Index(page, ".SH EXAMPLE"):]
	ex = ex[strings.Index(ex, ".nf\n")+4 : strings.Index(ex, ".fi\n")]
	f := filepath.Join(t.TempDir(), "gateway.toml")
	if err := os.WriteFile(f, []byte(ex), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := airlock("gateway", "--check", "--config", f, "--state", t.TempDir(), "--json"); strings.Contains(out+errs, f+":") {
		t.Errorf("the example of airlock-gateway.toml(5) does not load (exit %d):\n%s%s", code, out, errs)
	}
}
