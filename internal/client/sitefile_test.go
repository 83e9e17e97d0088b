// SPDX-License-Identifier: MIT

package client

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadSiteFile(t *testing.T) {
	dir := t.TempDir()
	worldTokenFile := filepath.Join(dir, "world-token")
	groupTokenFile := filepath.Join(dir, "group-token")
	for p, mode := range map[string]os.FileMode{worldTokenFile: 0o644, groupTokenFile: 0o640} {
		if err := os.WriteFile(p, []byte("alk1_x\n"), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		text    string
		mode    os.FileMode
		want    map[string]string
		wantErr string
		unsafe  bool
	}{
		{name: "join settings, world-readable", mode: 0o644,
			text: "# site defaults\n\nAIRLOCK_GATEWAY=gw.example:8443\n  AIRLOCK_PIN=sha256:00  \n",
			want: map[string]string{"AIRLOCK_GATEWAY": "gw.example:8443", "AIRLOCK_PIN": "sha256:00"}},
		{name: "token in a group-readable file", mode: 0o640, text: "AIRLOCK_TOKEN=alk1_x\n",
			want: map[string]string{"AIRLOCK_TOKEN": "alk1_x"}},
		{name: "token in a world-readable file", mode: 0o644, text: "AIRLOCK_GATEWAY=gw:1\nAIRLOCK_TOKEN=alk1_x\n",
			wantErr: "readable by every user of this node (mode 0644) and holds AIRLOCK_TOKEN", unsafe: true},
		{name: "world-readable token file named", mode: 0o644, text: "AIRLOCK_TOKEN_FILE=" + worldTokenFile + "\n",
			wantErr: "AIRLOCK_TOKEN_FILE=" + worldTokenFile + " is readable by every user", unsafe: true},
		{name: "group-readable token file named", mode: 0o644, text: "AIRLOCK_TOKEN_FILE=" + groupTokenFile + "\n",
			want: map[string]string{"AIRLOCK_TOKEN_FILE": groupTokenFile}},
		{name: "world-writable", mode: 0o666, text: "AIRLOCK_GATEWAY=gw:1\n",
			wantErr: "writable by every user of this node (mode 0666)", unsafe: true},
		{name: "not a setting line", mode: 0o644, text: "export AIRLOCK_GATEWAY=gw:1\n",
			wantErr: `:1: want AIRLOCK_NAME=VALUE, got "export AIRLOCK_GATEWAY=gw:1"`},
		{name: "other name", mode: 0o644, text: "PATH=/tmp\n", wantErr: `:1: want AIRLOCK_NAME=VALUE`},
		{name: "twice", mode: 0o644, text: "AIRLOCK_PIN=a\nAIRLOCK_PIN=b\n", wantErr: ":2: AIRLOCK_PIN set again (first on line 1)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "airlock.env")
			if err := os.WriteFile(p, []byte(tt.text), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(p, tt.mode); err != nil {
				t.Fatal(err)
			}
			s, err := LoadSiteFile(p, true)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got %v, want an error with %q", err, tt.wantErr)
				}
				if got := errors.Is(err, ErrSiteFileUnsafe); got != tt.unsafe {
					t.Errorf("errors.Is(err, ErrSiteFileUnsafe) = %v, want %v", got, tt.unsafe)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for _, v := range s.Values {
				got[v.Name] = v.Value
			}
			if len(got) != len(tt.want) {
				t.Errorf("got %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("%s: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

func TestLoadSiteFileAbsent(t *testing.T) {
	p := filepath.Join(t.TempDir(), "none.env")
	if s, err := LoadSiteFile(p, false); err != nil || len(s.Values) != 0 || s.Path != "" {
		t.Errorf("absent default file: got %+v, %v; want an empty file and no error", s, err)
	}
	if _, err := LoadSiteFile(p, true); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent named file: got %v, want a not-exist error", err)
	}
}

func TestLoadSiteFileOwner(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to give the file to another user")
	}
	p := filepath.Join(t.TempDir(), "airlock.env")
	if err := os.WriteFile(p, []byte("AIRLOCK_GATEWAY=gw:1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSiteFile(p, true); !errors.Is(err, ErrSiteFileUnsafe) || !strings.Contains(err.Error(), "owned by uid 65534, neither root nor you") {
		t.Errorf("file of another user: got %v, want the unsafe-owner refusal", err)
	}
}
