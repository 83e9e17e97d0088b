// SPDX-License-Identifier: MIT

package preflight

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// ControlOutside checks that the gateway's control port (listen,
// ADDR:PORT) is not reachable on an outside address: one of outside (the
// addresses jobs' flows leave from, which face the internet). The control
// port takes joins, so it belongs on the inside address the nodes reach;
// listening on every interface, or on an outside address, offers it to
// anyone outside to guess tokens at and flood (issue 33, item 6).
func ControlOutside(listen string, outside []netip.Addr) Result {
	r := Result{Name: "control port " + listen, Status: OK}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		r.Status, r.Detail, r.Fix = Problem, err.Error(), "give --listen as ADDR:PORT"
		return r
	}
	var out []string
	for _, a := range outside {
		if a.IsValid() && !slices.Contains(out, a.Unmap().String()) {
			out = append(out, a.Unmap().String())
		}
	}
	fix := fmt.Sprintf("listen on the inside address the nodes reach: --listen INSIDE_ADDRESS:%s (or keep the port closed to the outside with the host's firewall)", port)
	a, err := netip.ParseAddr(host)
	switch {
	case host == "" || err == nil && a.IsUnspecified():
		r.Status, r.Fix = Warn, fix
		r.Detail = "listens on every interface"
		if len(out) > 0 {
			r.Detail += fmt.Sprintf(", so also on the outside address %s (where jobs' flows leave): anyone outside can reach the control port", strings.Join(out, ", "))
		}
	case err != nil:
		r.Detail = "a host name: not checked against the outside addresses"
	case slices.Contains(out, a.Unmap().String()):
		r.Status, r.Fix = Warn, fix
		r.Detail = fmt.Sprintf("listens on %s, an outside address (jobs' flows leave from it): anyone outside can reach the control port", a)
	default:
		r.Detail = "not an outside address"
	}
	return r
}
