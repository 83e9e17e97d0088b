// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
)

func TestParseAttest(t *testing.T) {
	c, err := Parse("g.toml", []byte("version = 1\n[attest]\nsocket = \"/run/munge-airlock/munge.socket.2\"\nrequired = true\njob_uids = [0, 990]\norigin = \"any\"\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := c.Attest
	if !a.Set || a.Mode != AttestMunge || !a.Required || a.Socket != "/run/munge-airlock/munge.socket.2" || len(a.JobUIDs) != 2 || a.JobUIDs[1] != 990 || a.Origin != "any" {
		t.Errorf("attest %+v", a)
	}
	if c, err := Parse("g.toml", []byte("version = 1\n")); err != nil || c.Attest.Set {
		t.Errorf("no [attest]: %+v %v, want unset", c.Attest, err)
	}
	for _, tc := range []struct{ doc, want string }{
		{"[attest]\nmode = \"kerberos\"\n", `g.toml:3: attest.mode: "kerberos": want "munge" or "off"`},
		{"[attest]\nsocket = \"munge.sock\"\n", "attest.socket"},
		{"[attest]\norigin = \"near\"\n", "attest.origin"},
		{"[attest]\njob_uids = [-1]\n", "attest.job_uids"},
		{"[attest]\nmode = \"off\"\nrequired = true\n", "attest.required"},
		{"[attest]\nrequire = true\n", "unknown key"},
	} {
		_, err := Parse("g.toml", []byte("version = 1\n"+tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}
