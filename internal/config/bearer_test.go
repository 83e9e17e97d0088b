// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
	"time"
)

func TestParseBearer(t *testing.T) {
	doc := `version = 1
[bearer]
required = true
refresh = "10m"
min_refetch = "30s"
max_stale = "48h"
leeway = "5s"

[[issuer]]
name = "cms"
url = "https://cms-auth.web.cern.ch/"
audience = ["https://gw.example.org", "gw.example.org"]
scopes = ["compute.create"]
groups = ["/cms"]
ca_file = "/etc/grid-security/cms-ca.pem"
[[issuer.map]]
group = "/cms/production"
as = "cms-prod"
[[issuer.map]]
subject = "0a1b-2c3d"
as = "cms-alice"

[[policy.rule]]
action = "deny"
to = ["192.0.2.0/24"]
tokens = ["cms-prod"]
`
	c, err := Parse("g.toml", []byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	b := c.Bearer
	if !b.Required || b.Refresh != 10*time.Minute || b.MinRefetch != 30*time.Second || b.MaxStale != 48*time.Hour || b.Leeway != 5*time.Second || len(b.Issuers) != 1 {
		t.Fatalf("bearer %+v", b)
	}
	is := b.Issuers[0]
	if is.Name != "cms" || is.URL != "https://cms-auth.web.cern.ch/" || len(is.Audiences) != 2 || is.CAFile == "" || len(is.Map) != 2 {
		t.Fatalf("issuer %+v", is)
	}
	for _, tt := range []struct {
		sub    string
		groups []string
		want   string
	}{
		{"x", []string{"/cms", "/cms/production"}, "cms-prod"},
		{"0a1b-2c3d", []string{"/cms"}, "cms-alice"},
		{"y", []string{"/cms"}, "cms"},
	} {
		if got := is.As(tt.sub, tt.groups); got != tt.want {
			t.Errorf("As(%q, %q) = %q, want %q", tt.sub, tt.groups, got, tt.want)
		}
	}
	for _, tc := range []struct{ doc, want string }{
		{"[[issuer]]\nurl = \"https://x\"\n", "no name"},
		{"[[issuer]]\nname = \"a b\"\nurl = \"https://x\"\n", "issuer[1].name"},
		{"[[issuer]]\nname = \"a\"\nurl = \"http://x\"\n", "https"},
		{"[[issuer]]\nname = \"a\"\nurl = \"https://x\"\n[[issuer]]\nname = \"b\"\nurl = \"https://x\"\n", "also the url"},
		{"[[issuer]]\nname = \"a\"\nurl = \"https://x\"\nca_file = \"ca.pem\"\n", "absolute"},
		{"[[issuer]]\nname = \"a\"\nurl = \"https://x\"\n[[issuer.map]]\nas = \"b\"\n", "subject or group"},
		{"[[issuer]]\nname = \"a\"\nurl = \"https://x\"\n[[issuer.map]]\ngroup = \"/g\"\nas = \"b c\"\n", "map[1].as"},
		{"[[issuer]]\nname = \"a\"\nurl = \"https://x\"\naud = \"y\"\n", "unknown key"},
		{"[bearer]\nrequired = true\n", "without an [[issuer]]"},
		{"[bearer]\nrefresh = \"soon\"\n", "bearer.refresh"},
	} {
		_, err := Parse("g.toml", []byte("version = 1\n"+tc.doc))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.doc, err, tc.want)
		}
	}
}
