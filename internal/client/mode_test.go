// SPDX-License-Identifier: MIT

package client

import (
	"errors"
	"os"
	"strings"
	"testing"
)

func TestParseMode(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Mode
		ok   bool
	}{
		{"", ModeAuto, true}, {"auto", ModeAuto, true}, {"netns", ModeNetns, true},
		{"seccomp", ModeSeccomp, true}, {"preload", ModePreload, true}, {"proxy", ModeProxy, true},
		{"socks", "", false}, {"NETNS", "", false},
	} {
		got, err := ParseMode(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseMode(%q) = %q, %v; want %q, ok=%v", tc.in, got, err, tc.want, tc.ok)
		}
	}
}

func TestPlan(t *testing.T) {
	p := newPlan(ModeAuto)
	if p.current() != ModeNetns {
		t.Fatalf("auto starts with %q, want netns", p.current())
	}
	if got := p.line(); got != "airlock: mode netns: "+ModeNetns.covers() {
		t.Errorf("netns line %q", got)
	}
	if err := p.skip(errors.New("user namespaces are disabled: sysctl user.max_user_namespaces=0; ask the admin to raise it")); err != nil {
		t.Fatal(err)
	}
	if err := p.skip(errors.New("kernel 4.18 is older than 5.9")); err != nil {
		t.Fatal(err)
	}
	if p.current() != ModePreload {
		t.Fatalf("after two skips: %q, want preload", p.current())
	}
	line := p.line()
	for _, want := range []string{"airlock: mode preload (netns unavailable: user namespaces are disabled: sysctl user.max_user_namespaces=0; seccomp unavailable: kernel 4.18",
		"not covered: statically linked programs"} {
		if !strings.Contains(line, want) {
			t.Errorf("line %q lacks %q", line, want)
		}
	}
	if strings.Count(line, "\n") != 0 {
		t.Errorf("line %q is not one line", line)
	}
	if err := p.skip(errors.New("no library")); err != nil {
		t.Fatal(err)
	}
	if err := p.skip(errors.New("impossible")); err == nil {
		t.Error("skipping the last mode did not fail")
	}

	p = newPlan(ModeSeccomp)
	if err := p.skip(errors.New("kernel too old")); err == nil || !strings.Contains(err.Error(), "--mode seccomp: kernel too old") {
		t.Errorf("explicit mode skipped: %v, want an error naming it", err)
	}
	p = newPlan(ModeProxy)
	if got := p.line(); !strings.HasPrefix(got, "airlock: mode proxy (asked for): only programs that honour") {
		t.Errorf("explicit proxy line %q", got)
	}
}

func TestFindPreload(t *testing.T) {
	dir := t.TempDir()
	lib := dir + "/" + PreloadLibrary
	if _, err := findPreload(lib); err == nil {
		t.Error("missing explicit library accepted")
	}
	if err := os.WriteFile(lib, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := findPreload(lib)
	if err != nil || got != lib {
		t.Errorf("findPreload(%q) = %q, %v", lib, got, err)
	}
	// Next to this test binary there is no library: the error says where
	// it looked and how to fix it.
	if _, err := findPreload(""); err == nil || !strings.Contains(err.Error(), "--preload") {
		t.Errorf("findPreload without library: %v, want an error naming --preload", err)
	}
}
