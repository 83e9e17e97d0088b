// SPDX-License-Identifier: MIT

//go:build airlock_node

package main

import (
	"io"

	"github.com/spf13/cobra"
)

// The node build (go build -tags airlock_node): airlock run and version
// only, none of the gateway's and the fleet's packages, for a binary that
// starts fast on compute nodes (docs/install.md, "The node binary").

// adminCommands: none on a node.
func adminCommands(stdout, stderr io.Writer) []*cobra.Command { return nil }

// initGatewayChild: a node runs no gateway.
func initGatewayChild() {}
