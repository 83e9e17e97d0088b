// SPDX-License-Identifier: MIT

package config

import (
	"strings"
	"testing"
)

func TestCapture(t *testing.T) {
	cfg, err := Parse("t.toml", []byte(`
version = 1
[[policy.rule]]
name = "web"
action = "allow"
to = ["192.0.2.0/24"]
proto = "tcp"
ports = [80]
[[capture]]
name = "ids"
to = "/run/airlock/ids.pcap"
filter = "tcp and not port 22"
tokens = ["cms"]
rules = ["web"]
buffer = "8MiB"
snaplen = 200
[[capture]]
to = "tap:ids0"
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Capture) != 2 {
		t.Fatalf("feeds: got %d, want 2", len(cfg.Capture))
	}
	c := cfg.Capture[0]
	if c.Name != "ids" || c.To != "/run/airlock/ids.pcap" || c.BufferBytes != 8<<20 || c.Snaplen != 200 ||
		len(c.Rules) != 1 || c.Rules[0].Name != "web" || c.Filter.String() != "tcp and not port 22" || c.Tokens[0] != "cms" {
		t.Errorf("feed 1: got %+v", c)
	}
	if cfg.Capture[1].Name != "capture2" {
		t.Errorf("feed 2's name: got %q, want capture2", cfg.Capture[1].Name)
	}
	for _, tt := range []struct{ doc, want string }{
		{`to = "relative.pcap"`, "capture[1].to"},
		{`to = "/x"` + "\n" + `filter = "port http"`, "capture[1].filter"},
		{`to = "/x"` + "\n" + `rules = ["nope"]`, "capture[1].rules"},
		{`to = "/x"` + "\n" + `buffer = "1KiB"`, "capture[1].buffer"},
		{`to = "/x"` + "\n" + `snaplen = -1`, "capture[1].snaplen"},
		{`to = "tap:"`, "capture[1].to"},
		{`filter = "tcp"`, "capture[1]: no to"},
		{`to = "/x"` + "\n" + `colour = "red"`, "colour"},
	} {
		_, err := Parse("t.toml", []byte("version = 1\n[[capture]]\n"+tt.doc+"\n"))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%q: got %v, want an error naming %s", tt.doc, err, tt.want)
		}
	}
}
