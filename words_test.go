// SPDX-License-Identifier: MIT

package airlock

// Words that stay true: the documentation (README.md, docs/*.md and the
// other Markdown files of the repository) and the comments of the Go
// sources name files, command-line flags and struct fields that exist
// today. A renamed file, a removed flag or a field that moved fails here,
// naming the place that still says the old word.

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// wordSource is one text the test reads: a Markdown file, or the comments
// of one Go file.
type wordSource struct {
	path string // slash-separated, from the repository root
	text string
	isGo bool
}

// wordSources returns the Markdown files and the Go files' comments,
// without the generated command reference (docs/cli, docs/man: made from
// the flags themselves), the changelog (history: it names what was) and
// third-party code.
func wordSources(t *testing.T) []wordSource {
	t.Helper()
	var out []wordSource
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch p {
			case ".git", "third_party", "docs/cli", "docs/man", "dist", "bin", "docs/benchmarks":
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case p == "CHANGELOG.md":
		case strings.HasSuffix(p, ".md"):
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out = append(out, wordSource{path: filepath.ToSlash(p), text: string(b)})
		case strings.HasSuffix(p, ".go"):
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			var sb strings.Builder
			for _, cg := range f.Comments {
				sb.WriteString(cg.Text())
				sb.WriteString("\n")
			}
			out = append(out, wordSource{path: filepath.ToSlash(p), text: sb.String(), isGo: true})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// repoFiles returns every file and directory of the repository, by path.
func repoFiles(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p == ".git" {
			return filepath.SkipDir
		}
		out[filepath.ToSlash(p)] = true
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// namedPath is a path a text names: one or more slash-separated parts
// ending in a file name with a source or document extension.
var namedPath = regexp.MustCompile(`(?:^|[^\w./-])((?:[\w.-]+/)*[\w-]+\.(?:go|c|h|md|sh|toml|py|service|conf))\b`)

// TestNamedFilesExist: every file a doc or comment names exists, at the
// path given from the repository root, from the naming file's directory,
// or (for a path below internal/, cmd/ or test/ given without that
// prefix, like forward/kernel/doc.go, or a bare file name in a comment of
// the same package) as the end of a path of the repository.
func TestNamedFilesExist(t *testing.T) {
	files := repoFiles(t)
	suffix := func(name string) bool {
		for f := range files {
			if f == name || strings.HasSuffix(f, "/"+name) {
				return true
			}
		}
		return false
	}
	var bad []string
	for _, src := range wordSources(t) {
		dir := filepath.ToSlash(filepath.Dir(src.path))
		for _, m := range namedPath.FindAllStringSubmatch(src.text, -1) {
			name := strings.TrimPrefix(m[1], "./")
			if files[name] || files[filepath.ToSlash(filepath.Join(dir, name))] {
				continue
			}
			if !strings.Contains(name, "/") {
				// A bare name: the naming file's own directory, else any
				// file of that name (a comment about another package's
				// file, or a Markdown file naming one in prose).
				if !strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, ".md") {
					continue // host files (resolv.conf, slurm.conf) and C headers
				}
				if suffix(name) {
					continue
				}
			} else if suffix(name) {
				continue
			}
			if outsideName(name) {
				continue
			}
			bad = append(bad, src.path+": "+name)
		}
	}
	for _, b := range dedup(bad) {
		t.Errorf("%s: no such file (renamed or gone? fix the text)", b)
	}
}

// outsideName reports whether name is a file outside this repository that
// the texts may name: other projects' files (the style anchors), files on
// the host, files a test or the gateway makes at run time.
func outsideName(name string) bool {
	for _, p := range []string{
		"wgengine/", "tun/", "device/", "net/tstun/", "ipn/", "cmd/tailscaled/", "pkg/tcpip/", "pkg/port/", "g3doc/",
		"src/plugins/", "replay/", "conn/", "transport/tcp/", "tcp_splice.c", "isolation.c", "main.go",
		"etc/", "proc/", "sys/", "usr/", "lib/", "var/", "run/",
		// MUNGE's, the kernel's, glibc's and Slurm's sources and headers.
		"src/", "include/", "sysdeps/", "net/ipv4/", "slurm/spank.h",
	} {
		if strings.HasPrefix(name, p) || name == strings.TrimSuffix(p, "/") {
			return true
		}
	}
	return false
}

// cliFlag is a long flag in the generated command reference.
var cliFlag = regexp.MustCompile("(?m)^\\s+(?:-\\w, )?--([a-z0-9-]+)")

// benchFlag is an option bench/run.sh parses (a case arm).
var benchFlag = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)\)`)

// namedFlag is a long flag a text names, with the character before it.
var namedFlag = regexp.MustCompile("(?:^|[\\s`(\\[\"'=,/])--([a-z][a-z0-9]*(?:-[a-z0-9]+)*)")

// TestNamedFlagsExist: every long flag a doc or comment names is one of
// airlock's (docs/cli, generated from the commands; the deprecated
// aliases, hidden there), of bench/run.sh, or one of another program's
// that the texts show (go test, curl, iperf3, ...), listed here with the
// program.
func TestNamedFlagsExist(t *testing.T) {
	known := map[string]bool{
		// Deprecated aliases (hidden from the reference).
		"subnet6": true, "egress-addr6": true, "egress-prefix6": true,
	}
	refs, _ := filepath.Glob("docs/cli/*.md")
	if len(refs) == 0 {
		t.Fatal("no docs/cli/*.md: run make docs")
	}
	for _, r := range refs {
		b, err := os.ReadFile(r)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range cliFlag.FindAllStringSubmatch(string(b), -1) {
			known[m[1]] = true
		}
	}
	bench, err := os.ReadFile("bench/run.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range benchFlag.FindAllStringSubmatch(string(bench), -1) {
		known[m[1]] = true
	}
	for _, f := range otherProgramsFlags {
		known[f] = true
	}
	var bad []string
	for _, src := range wordSources(t) {
		for _, m := range namedFlag.FindAllStringSubmatch(src.text, -1) {
			if !known[m[1]] {
				bad = append(bad, src.path+": --"+m[1])
			}
		}
	}
	for _, b := range dedup(bad) {
		t.Errorf("%s: no airlock command has this flag (renamed or gone? fix the text; another program's flag: add it to otherProgramsFlags)", b)
	}
}

// otherProgramsFlags are flags of other programs that the docs and
// comments show in commands.
var otherProgramsFlags = []string{
	// go, go test
	"update", "tags", "modfile",
	// curl
	"resolve", "socks5", "socks5-hostname", "proxy", "max-time", "connect-timeout", "silent", "fail", "insecure", "unix-socket", "cacert", "interface", "output", "data", "header", "noproxy",
	// iperf3
	"bidir", "reverse", "json", "parallel", "time", "client", "server", "udp", "bitrate", "one-off", "bind", "port",
	// ip, nft, tc, ss, sysctl, systemd, apt, rpm, dpkg, docker, git, slurm, munge, cvmfsexec, ...
	"system", "user", "now", "no-pager", "ntasks", "wrap", "job-name", "export", "cpus-per-task", "mem", "partition", "chdir",
	"no-install-recommends", "yes", "force", "nodeps", "rm", "privileged", "cap-add", "network", "volume", "name", "net",
	"prefix", "nodaemon", "key", "socket", "cred", "payload", "verbose", "version", "help", "all", "family",
	"userns", "map-root-user", "fork", "pid", "mount", "mount-proc", "uts", "ipc", "map-current-user", "keep-caps", "root",
	"squid", "test", "foreground", "config", "mode", "stdout", "stderr", "quiet", "dry-run", "check", "listen",
	// the Slurm SPANK plugin's sbatch/srun option (slurm/), srun, sbatch
	"airlock", "multi-prog", "task-prolog", "parsable",
	// munge, unmunge
	"key-file", "origin", "input",
	// rpm, systemd-sysusers, systemd-tmpfiles
	"addsign", "create", "offline",
	// curl, openvpn, openconnect, vpnns
	"limit-rate", "data-ciphers", "disable-dco", "peer-fingerprint", "no-dtls", "script-tun", "script", "attach",
	// bwrap (bubblewrap), unshare: containers inside jobs (docs/jobs.md, test/e2e)
	"unshare-net", "unshare-user", "unshare-pid", "dev-bind", "ro-bind", "bind-try", "share-net", "die-with-parent", "proc", "dev",
	// a job's own arguments in examples (airlock run -- ./my-job --with args)
	"with",
}

// dedup returns ss sorted without repeats.
func dedup(ss []string) []string {
	sort.Strings(ss)
	out := ss[:0]
	for i, s := range ss {
		if i == 0 || s != ss[i-1] {
			out = append(out, s)
		}
	}
	return out
}

// fieldRef is Type.Name in a comment (not pkg.Type.Name: another
// package's).
var fieldRef = regexp.MustCompile(`(?:^|[^\w.])([A-Z]\w*)\.([A-Z]\w*)\b`)

// TestNamedFieldsExist: a Go comment that names Type.Name, Type being a
// struct type of the comment's own package, names a field or method of
// it. Types with embedded fields are left alone (their names come from
// elsewhere), and so is a Name that some type or interface of the package
// has (Field.Method: Config.Attest.Required).
func TestNamedFieldsExist(t *testing.T) {
	dirs := map[string]bool{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == ".git" || p == "third_party") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") {
			dirs[filepath.Dir(p)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var bad []string
	for dir := range dirs {
		bad = append(bad, checkFieldRefs(t, dir)...)
	}
	for _, b := range dedup(bad) {
		t.Errorf("%s (renamed or gone? fix the comment)", b)
	}
}

// pkgMembers are the names a package's types have.
type pkgMembers struct {
	members  map[string]map[string]bool // struct type → fields and methods
	embedded map[string]bool            // struct types with embedded fields
	any      map[string]bool            // every field, method and interface method
}

func (pm *pkgMembers) add(typ, name string) {
	m := pm.members[typ]
	if m == nil {
		m = map[string]bool{}
		pm.members[typ] = m
	}
	m[name] = true
	pm.any[name] = true
}

// collect adds the struct types, fields and methods of f.
func (pm *pkgMembers) collect(f *ast.File) {
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.GenDecl:
			for _, s := range d.Specs {
				if ts, ok := s.(*ast.TypeSpec); ok {
					pm.collectType(ts)
				}
			}
		case *ast.FuncDecl:
			if d.Recv == nil || len(d.Recv.List) == 0 {
				continue
			}
			rt := d.Recv.List[0].Type
			if s, ok := rt.(*ast.StarExpr); ok {
				rt = s.X
			}
			if ix, ok := rt.(*ast.IndexExpr); ok {
				rt = ix.X
			}
			if id, ok := rt.(*ast.Ident); ok {
				pm.add(id.Name, d.Name.Name)
			}
		}
	}
}

func (pm *pkgMembers) collectType(ts *ast.TypeSpec) {
	switch t := ts.Type.(type) {
	case *ast.InterfaceType:
		for _, fl := range t.Methods.List {
			for _, n := range fl.Names {
				pm.any[n.Name] = true
			}
		}
	case *ast.StructType:
		if pm.members[ts.Name.Name] == nil {
			pm.members[ts.Name.Name] = map[string]bool{}
		}
		for _, fl := range t.Fields.List {
			if len(fl.Names) == 0 {
				pm.embedded[ts.Name.Name] = true
			}
			for _, n := range fl.Names {
				pm.add(ts.Name.Name, n.Name)
			}
		}
	}
}

// checkFieldRefs checks the comments of the Go files of one directory.
func checkFieldRefs(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]*pkgMembers{}
	files := map[string]*ast.File{}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".go") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files[p] = f
		name := strings.TrimSuffix(f.Name.Name, "_test")
		if pkgs[name] == nil {
			pkgs[name] = &pkgMembers{members: map[string]map[string]bool{}, embedded: map[string]bool{}, any: map[string]bool{}}
		}
		pkgs[name].collect(f)
	}
	var bad []string
	for p, f := range files {
		pm := pkgs[strings.TrimSuffix(f.Name.Name, "_test")]
		for _, cg := range f.Comments {
			for _, m := range fieldRef.FindAllStringSubmatch(cg.Text(), -1) {
				members, ok := pm.members[m[1]]
				if !ok || pm.embedded[m[1]] || members[m[2]] || pm.any[m[2]] {
					continue
				}
				bad = append(bad, filepath.ToSlash(p)+": "+m[1]+"."+m[2]+" is no field or method of "+m[1])
			}
		}
	}
	return bad
}
