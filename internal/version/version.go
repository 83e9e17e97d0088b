// SPDX-License-Identifier: MIT

// Package version says which build of Airlock this is: its semantic
// version, the commit and the time it was built from, and the Go toolchain.
//
// make and the release tarballs set the values with the linker
// (-ldflags "-X github.com/airlock-vpn/airlock/internal/version.version=v0.3.0"
// and likewise commit and date); a binary built with `go install
// github.com/airlock-vpn/airlock/cmd/airlock@v0.3.0` or `go build` in a
// checkout takes them from the module's build information instead, so no
// build says "dev" when it knows better.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// Set by the linker; empty in a plain go build.
var (
	version string
	commit  string
	date    string
)

// Info describes one build. Its zero value is an unknown build.
type Info struct {
	// Version is a semantic version with a leading v ("v0.3.0",
	// "v0.3.1-0.20261125142900-3b3d3d9a1b2c" between releases), or "dev"
	// when the build knows none.
	Version string `json:"version"`
	// Commit is the git commit (abbreviated or full), empty if unknown;
	// Modified says the work tree had uncommitted changes.
	Commit   string `json:"commit,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	// Date is when the commit was made (RFC 3339), which is also the
	// build's date in reproducible builds; empty if unknown.
	Date      string `json:"date,omitempty"`
	GoVersion string `json:"go"`
	Platform  string `json:"platform"`
}

// Get returns this binary's build information.
func Get() Info {
	i := Info{Version: version, Commit: commit, Date: date, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := debug.ReadBuildInfo(); ok {
		fromBuildInfo(&i, bi)
	}
	if strings.HasSuffix(i.Commit, "-dirty") {
		i.Commit, i.Modified = strings.TrimSuffix(i.Commit, "-dirty"), true
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	return i
}

// fromBuildInfo fills in what the linker did not set.
func fromBuildInfo(i *Info, bi *debug.BuildInfo) {
	if i.Version == "" && semver.IsValid(bi.Main.Version) {
		i.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			if i.Commit == "" {
				i.Commit = s.Value
			}
		case "vcs.time":
			if i.Date == "" {
				i.Date = s.Value
			}
		case "vcs.modified":
			if s.Value == "true" && commit == "" {
				i.Modified = true
			}
		}
	}
}

// String is the one line `airlock --version` prints.
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "airlock %s", i.Version)
	if i.Commit != "" {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		if i.Modified {
			c += "-dirty"
		}
		fmt.Fprintf(&b, " (commit %s", c)
		if i.Date != "" {
			fmt.Fprintf(&b, ", %s", i.Date)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, " %s %s", i.GoVersion, i.Platform)
	return b.String()
}

// MinClient is the oldest client version a gateway of this build serves.
// A client that sends no version predates the exchange (v0.2); it is
// served, since v0.2's protocol is this one's. Raise it, with a
// CHANGELOG entry, when the gateway drops what older clients need.
const MinClient = "v0.2.0"

// CheckClient reports whether a gateway of this build serves a client of
// version v (a JoinRequest's, "" for a client before the exchange): nil,
// or an error that names both versions and the fix. A version that is not
// semantic, or a pseudo-version of a commit with no release tag behind it
// (v0.0.0-DATE-COMMIT: a build from a clone without tags), is a
// development build, and served.
func CheckClient(v string) error {
	if !semver.IsValid(v) || untagged(v) || semver.Compare(v, MinClient) >= 0 {
		return nil
	}
	return fmt.Errorf("airlock %s on this node is older than this gateway (%s) serves: %s or later; upgrade airlock on the node", v, Get().Version, MinClient)
}

// Label is v as a metric label: "v0.3" (major.minor), "none" for a
// client before the version exchange, "dev" for a development build, so
// that a client cannot make up label values beyond versions.
func Label(v string) string {
	switch {
	case v == "":
		return "none"
	case semver.IsValid(v) && !untagged(v):
		return semver.MajorMinor(v)
	}
	return "dev"
}

// untagged reports whether v is the pseudo-version Go gives a build of a
// commit that no release tag precedes (v0.0.0-DATE-COMMIT): it orders
// below every release, though the code may be the newest.
func untagged(v string) bool {
	if !module.IsPseudoVersion(v) {
		return false
	}
	base, err := module.PseudoVersionBase(v)
	return err == nil && base == ""
}
