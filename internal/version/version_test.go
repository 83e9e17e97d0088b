// SPDX-License-Identifier: MIT

package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestCheckClient(t *testing.T) {
	for _, tt := range []struct {
		v  string
		ok bool
	}{
		{"", true}, {"v0.2.0", true}, {"v0.2.1-0.20261125143023-e569141aef10", true}, {"v1.0.0", true},
		{"dev", true}, {"garbage", true}, {"v0.1.9", false}, {"v0.2.0-rc.1", false},
		// A build of a clone without tags: a development build.
		{"v0.0.0-20261128120844-ff84ef837712", true}, {"v0.1.10-0.20261128120844-ff84ef837712", false},
	} {
		err := CheckClient(tt.v)
		if (err == nil) != tt.ok {
			t.Errorf("CheckClient(%q): %v, want ok %v", tt.v, err, tt.ok)
		}
		if err != nil && (!strings.Contains(err.Error(), tt.v) || !strings.Contains(err.Error(), MinClient)) {
			t.Errorf("CheckClient(%q): %q names not both versions", tt.v, err)
		}
	}
}

func TestLabel(t *testing.T) {
	for in, want := range map[string]string{"": "none", "v0.3.1": "v0.3", "v1.2.3-rc1+x": "v1.2", "dev": "dev", "\x1b[31mred": "dev", "v0.0.0-20261128120844-ff84ef837712": "dev"} {
		if got := Label(in); got != want {
			t.Errorf("Label(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFromBuildInfo(t *testing.T) {
	bi := &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "0123456789abcdef0123"}, {Key: "vcs.time", Value: "2026-11-25T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	var i Info
	fromBuildInfo(&i, bi)
	if i.Version != "v0.3.0" || i.Commit != "0123456789abcdef0123" || i.Date != "2026-11-25T10:00:00Z" || !i.Modified {
		t.Errorf("fromBuildInfo: %+v", i)
	}
	// The linker's values win; "(devel)" is no version.
	i = Info{Version: "v0.4.0", Commit: "abc"}
	fromBuildInfo(&i, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}})
	if i.Version != "v0.4.0" || i.Commit != "abc" {
		t.Errorf("fromBuildInfo over linker values: %+v", i)
	}
	if s := (Info{Version: "v0.3.0", Commit: "0123456789abcdef", Modified: true, Date: "D", GoVersion: "go1", Platform: "linux/amd64"}).String(); s != "airlock v0.3.0 (commit 0123456789ab-dirty, D) go1 linux/amd64" {
		t.Errorf("String: %q", s)
	}
}
