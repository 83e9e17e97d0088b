// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

// TestOpenKernelTCPUnavailable checks the choice of TCP stack where the
// private namespace cannot be made (here: the test binary does not call
// usernet.Init, which Open refuses as it would a host without user
// namespaces): auto falls back to the netstack and says why, kernel fails
// with the fix, netstack does not try.
func TestOpenKernelTCPUnavailable(t *testing.T) {
	for _, tc := range []struct {
		stack   string
		wantErr string // substring; "" means no error
		wantLog string // substring of the logs; "" means none
	}{
		{TCPStackNetstack, "", ""},
		{"", "", ""},
		{TCPStackAuto, "", "falls back"},
		{TCPStackKernel, "use --tcp-stack netstack", ""},
		{"bogus", `bad tcp stack "bogus"`, ""},
	} {
		t.Run(tc.stack, func(t *testing.T) {
			var logs bytes.Buffer
			cfg := Config{
				Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
				TCPStack: tc.stack,
				MTU:      DefaultMTU,
			}
			ns, err := openKernelTCP(cfg, []netip.Prefix{netip.MustParsePrefix("100.64.0.1/16"), netip.MustParsePrefix("fd00:a10c::1/64")}, cfg.MTU)
			if ns != nil {
				ns.Close()
				t.Fatal("got a private namespace, want none")
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("got error %v, want none", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("got error %v, want one containing %q", err, tc.wantErr)
			}
			if tc.wantLog == "" && logs.Len() > 0 {
				t.Errorf("logged %q, want nothing", logs.String())
			}
			if tc.wantLog != "" && (!strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "usernet.Init")) {
				t.Errorf("logged %q, want a warning that names the cause", logs.String())
			}
		})
	}
}
