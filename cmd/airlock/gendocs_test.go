// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"flag"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
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
	if err := doc.GenMarkdownTree(root, md); err != nil {
		t.Fatal(err)
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
			if _, ok := gen[name]; !ok {
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
		if _, ok := newFiles[name]; !ok {
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
	pages, _ := filepath.Glob(filepath.Join(manDir, "*.1"))
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
