// SPDX-License-Identifier: MIT

package preflight

import (
	"net/netip"
	"strings"
	"testing"
)

// TestControlOutside (issue 33, item 6): `gateway --check` warns when the
// control port is reachable on an outside address: listening on every
// interface, or on an address jobs' flows leave from.
func TestControlOutside(t *testing.T) {
	outside := []netip.Addr{netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")}
	for _, tc := range []struct {
		listen string
		want   Status
		says   string
	}{
		{"0.0.0.0:8443", Warn, "203.0.113.1"},
		{":8443", Warn, "every interface"},
		{"[::]:8443", Warn, "every interface"},
		{"203.0.113.1:8443", Warn, "outside address"},
		{"[2001:db8::1]:8443", Warn, "outside address"},
		{"10.0.0.1:8443", OK, "not an outside"},
		{"gw.inside:8443", OK, "host name"},
	} {
		r := ControlOutside(tc.listen, outside)
		if r.Status != tc.want || !strings.Contains(r.Detail, tc.says) || (tc.want == Warn && !strings.Contains(r.Fix, "INSIDE_ADDRESS:8443")) {
			t.Errorf("ControlOutside(%q) = %+v, want %v saying %q", tc.listen, r, tc.want, tc.says)
		}
	}
}
