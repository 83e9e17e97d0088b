// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/usernet"
)

// The full airlock: the node's commands (run, version) and the gateway's
// and its admins' (this file). `go build -tags airlock_node` leaves this
// file out for commands_node.go, and with it every package of the gateway
// and the fleet (docs/install.md, "The node binary").

// adminCommands are the gateway's and its admins' commands.
func adminCommands(stdout, stderr io.Writer) []*cobra.Command {
	return []*cobra.Command{
		newGatewayCmd(stdout, stderr),
		newTokenCmd(stdout, stderr),
		newWhoisCmd(stdout, stderr),
		newStatusCmd(stdout, stderr),
		newFlowsCmd(stdout, stderr),
		newKickCmd(stdout, stderr),
		newCaptureCmd(stdout, stderr),
		newPolicyCmd(stdout, stderr),
		newDBCmd(stdout),
	}
}

// initGatewayChild runs the gateway's private namespace child
// (--tcp-stack kernel) when this process is one; it then never returns.
func initGatewayChild() { usernet.Init() }
