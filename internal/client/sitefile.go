// SPDX-License-Identifier: MIT

package client

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// The site file: defaults an admin sets once per node for every job.
//
// airlock run reads AIRLOCK_NAME=VALUE lines from the site file
// (DefaultSiteFile, or the file --site-file / AIRLOCK_SITE_FILE names) for
// the settings the job left unset on its command line and in its
// environment, as the SPANK plugin's env= file and the HTCondor wrapper's
// condor.env already do; the file has the same format, so one file can
// serve all three. A job that sets one setting of a group (the gateways
// and their pins; the token and the token file) takes none of that group
// from the site file: a job's own gateway with the site's pin, or its own
// token with the site's token file, would only fail.
//
// The file is trusted as the site's word, so it must be the site's:
// owned by root (or by the user who runs airlock) and writable by no one
// else; a user of the node who could write it would send every job to a
// gateway of their own. It may be world-readable (gateway and pins are no
// secret) unless it holds a token, which then every user of the node
// could read; a world-readable site file with AIRLOCK_TOKEN, or naming a
// world-readable AIRLOCK_TOKEN_FILE, is refused. The checks are made on
// the open file (fstat), not on its name.

// DefaultSiteFile is the site file airlock run reads when neither
// --site-file nor AIRLOCK_SITE_FILE names another. It may be absent.
const DefaultSiteFile = "/etc/airlock/airlock.env"

// EnvSiteFile names the site file in the environment (airlock run
// --site-file).
const EnvSiteFile = "AIRLOCK_SITE_FILE"

// maxSiteFile bounds the site file's size.
const maxSiteFile = 64 << 10

// SiteValue is one AIRLOCK_NAME=VALUE line of a site file.
type SiteValue struct {
	Name  string // AIRLOCK_GATEWAY
	Value string
	Line  int // 1-based
}

// SiteFile is a parsed site file. The zero value is an absent file.
type SiteFile struct {
	Path   string
	Values []SiteValue // in file order, each name once
}

// Lookup returns the value of name and its line, ok false if the file does
// not set it.
func (s SiteFile) Lookup(name string) (v SiteValue, ok bool) {
	for _, sv := range s.Values {
		if sv.Name == name {
			return sv, true
		}
	}
	return SiteValue{}, false
}

// ErrSiteFileUnsafe is wrapped by LoadSiteFile's refusals of a file that
// others could write, or that lets every user read a token.
var ErrSiteFileUnsafe = errors.New("unsafe site file")

// LoadSiteFile reads and checks the site file at path. A missing file is
// an empty SiteFile and no error unless required (the user named it).
func LoadSiteFile(path string, required bool) (SiteFile, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && !required {
		return SiteFile{}, nil
	}
	if err != nil {
		return SiteFile{}, fmt.Errorf("site file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return SiteFile{}, fmt.Errorf("site file %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return SiteFile{}, fmt.Errorf("site file %s: not a regular file", path)
	}
	if err := checkSiteOwner(path, fi); err != nil {
		return SiteFile{}, err
	}
	s, err := parseSiteFile(path, io.LimitReader(f, maxSiteFile+1))
	if err != nil {
		return SiteFile{}, err
	}
	if _, ok := s.Lookup(envToken); ok && fi.Mode().Perm()&0o004 != 0 {
		return SiteFile{}, fmt.Errorf("%w: %s is readable by every user of this node (mode %04o) and holds %s: move the token to a file of its own readable only by the group whose jobs may use it (chmod 640; %s=PATH here), or join with no token at all with MUNGE attestation (docs/security.md)",
			ErrSiteFileUnsafe, path, fi.Mode().Perm(), envToken, envTokenFile)
	}
	if v, ok := s.Lookup(envTokenFile); ok {
		if tfi, err := os.Stat(v.Value); err == nil && tfi.Mode().Perm()&0o004 != 0 {
			return SiteFile{}, fmt.Errorf("%w: %s:%d: %s=%s is readable by every user of this node (mode %04o): make it readable only by the job's user or group (chmod o-r)",
				ErrSiteFileUnsafe, path, v.Line, envTokenFile, v.Value, tfi.Mode().Perm())
		}
	}
	return s, nil
}

// checkSiteOwner refuses a site file that a user other than root and the
// caller could write.
func checkSiteOwner(path string, fi os.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return nil
	}
	if uid := os.Getuid(); st.Uid != 0 && int(st.Uid) != uid {
		return fmt.Errorf("%w: %s is owned by uid %d, neither root nor you: whoever owns it chooses the gateway of every job; chown root:root %s",
			ErrSiteFileUnsafe, path, st.Uid, path)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("%w: %s is writable by every user of this node (mode %04o): any of them could send every job to a gateway of their own; chmod o-w %s",
			ErrSiteFileUnsafe, path, fi.Mode().Perm(), path)
	}
	return nil
}

// parseSiteFile reads AIRLOCK_NAME=VALUE lines; blank lines and lines
// starting with # are skipped. A value is taken as written (no quotes are
// removed), as the SPANK plugin and the HTCondor wrapper read it.
func parseSiteFile(path string, r io.Reader) (SiteFile, error) {
	s := SiteFile{Path: path}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxSiteFile)
	n, size := 0, 0
	for sc.Scan() {
		n++
		size += len(sc.Bytes()) + 1
		if size > maxSiteFile {
			return SiteFile{}, fmt.Errorf("site file %s: larger than %d bytes", path, maxSiteFile)
		}
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || !validSiteName(name) {
			return SiteFile{}, fmt.Errorf("site file %s:%d: want AIRLOCK_NAME=VALUE, got %q", path, n, truncate(line, 60))
		}
		if prev, dup := s.Lookup(name); dup {
			return SiteFile{}, fmt.Errorf("site file %s:%d: %s set again (first on line %d)", path, n, name, prev.Line)
		}
		s.Values = append(s.Values, SiteValue{Name: name, Value: value, Line: n})
	}
	if err := sc.Err(); err != nil {
		return SiteFile{}, fmt.Errorf("site file %s: %w", path, err)
	}
	return s, nil
}

// validSiteName reports whether name is AIRLOCK_ and capitals, digits or
// underscores.
func validSiteName(name string) bool {
	rest, ok := strings.CutPrefix(name, "AIRLOCK_")
	if !ok || rest == "" {
		return false
	}
	for _, c := range rest {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') && c != '_' {
			return false
		}
	}
	return true
}

// truncate shortens s to n bytes for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
