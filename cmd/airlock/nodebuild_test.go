// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

// TestNodeBuild checks the node binary's promise (go build -tags
// airlock_node; commands_node.go): none of the gateway's, the fleet's or
// the admin tools' packages is linked into it: no egress backend
// (forward, its user-mode stack and usernet, the flow table), no store
// (bbolt), nor the gateway's config (TOML), capture and metrics
// (Prometheus, protobuf) libraries or nftables. The layer rules in general
// are the root package's TestLayers.
func TestNodeBuild(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "airlock_node", ".").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	deps := strings.Fields(string(out))
	const mod = "github.com/airlock-vpn/airlock/"
	for _, bad := range []string{mod + "internal/gateway", mod + "internal/fleet", mod + "internal/store/pgstore", mod + "internal/admin",
		mod + "internal/metrics", mod + "internal/forward/kernel", mod + "internal/config", mod + "internal/capture",
		mod + "internal/forward", mod + "internal/usernet", mod + "internal/store", mod + "internal/flows", mod + "internal/lease",
		"go.etcd.io/bbolt", "github.com/google/nftables", "gopkg.in/natefinch/lumberjack.v2",
		"github.com/jackc/pgx/v5", "github.com/pelletier/go-toml/v2", "github.com/prometheus/client_golang", "google.golang.org/protobuf"} {
		for _, d := range deps {
			if d == bad || strings.HasPrefix(d, bad+"/") {
				t.Errorf("the node build links %s", d)
				break
			}
		}
	}
}

// TestDeadCodeElimination builds airlock with the linker's dependency
// dump and checks that no template execution is reachable: cobra runs
// --version and help through text/template only when a template is set
// (SetVersionTemplate and friends), and a reachable Template.Execute
// calls reflect's Method with names known only at run time, which makes
// the linker keep every exported method of every type in the binary.
func TestDeadCodeElimination(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	cmd := exec.Command("go", "build", "-ldflags=-dumpdep", "-o", "/dev/null", ".")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go build: %v\n%.2000s", err, stderr.String())
	}
	for _, line := range strings.Split(stderr.String(), "\n") {
		if strings.HasSuffix(line, "-> text/template.(*Template).Execute") || strings.HasSuffix(line, "-> text/template.(*Template).execute") {
			t.Errorf("a template execution is reachable (%s): the linker's dead-code elimination of methods is off", line)
		}
	}
}
