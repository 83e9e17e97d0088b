// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/usernet"
)

func TestMain(m *testing.M) {
	usernet.Init()
	os.Exit(m.Run())
}

// tcpStacks are the two ways the Stack terminates jobs' TCP; TCP tests run
// against both.
var tcpStacks = []string{"netstack", "kernel"}

// tcpStackConfig returns a Config whose jobs' TCP is terminated by the
// named stack: for "kernel", a private namespace of its own (the Stack
// closes it).
func tcpStackConfig(t *testing.T, name string) Config {
	t.Helper()
	if name != "kernel" {
		return Config{}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ns, err := usernet.Open(ctx, []netip.Prefix{gwPrefix.Masked(), gwPrefix6.Masked()}, DefaultMTU, 1)
	if err != nil {
		t.Fatalf("open private namespace for kernel tcp: %v", err)
	}
	return Config{KernelTCP: ns}
}
