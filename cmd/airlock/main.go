// SPDX-License-Identifier: MIT

// Command airlock is a rootless VPN and egress gateway for batch jobs:
// `airlock gateway` runs the gateway in the site's DMZ, `airlock run -- CMD`
// runs CMD on a compute node with all its traffic carried through it, and
// `airlock token`, `status`, `flows`, `whois`, `kick` and `capture` are the
// gateway admin's tools. cli.go says how the commands are built.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/fusemount"
	"github.com/airlock-vpn/airlock/internal/nsexec"
	"github.com/airlock-vpn/airlock/internal/seccompnotify"
	"github.com/airlock-vpn/airlock/internal/usernet"
	"github.com/airlock-vpn/airlock/internal/version"
)

func main() {
	// A re-executed namespace child sets up the job's namespace and execs
	// the job; it never returns here.
	nsexec.Init()
	// Run as fusermount3 inside a job, or as the job's mount server
	// (internal/fusemount), airlock does that and exits.
	fusemount.Main()
	// So does the gateway's private namespace child (--tcp-stack kernel).
	usernet.Init()
	// A re-executed seccomp shim installs the job's connect filter and
	// execs the job; it never returns here either.
	seccompnotify.Init()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(longFlagsCompat(root, args, stderr))
	cmd, err := root.ExecuteC()
	var ee exitError
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "airlock: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		if cmd.Name() == "run" && cmd.HasParent() && !cmd.Parent().HasParent() {
			return client.ExitFailure // the job did not run: as for every airlock run failure
		}
		return exitUsage
	default:
		fmt.Fprintf(stderr, "airlock: %v\n", err)
		return exitFailure
	}
}

// newRoot returns the airlock command with all its subcommands, writing
// to stdout (help, results) and stderr (errors, logs).
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "airlock",
		Short: "rootless VPN and egress gateway for batch jobs",
		Long: strings.TrimSpace(`
Airlock carries all network traffic of an unmodified batch job through one
gateway in the site's DMZ, with no root on the compute node.

    airlock gateway                run the gateway (admin; state in ` + defaultStateDir + `)
    airlock token create           make a join token (admin)
    airlock status                 the running gateway's jobs and traffic (admin)
    airlock run -- CMD [ARGS...]   run a job through the gateway

Jobs read AIRLOCK_GATEWAY, AIRLOCK_PIN (both in the gateway's join.env) and
AIRLOCK_TOKEN from the environment. Every flag of run is also read from
AIRLOCK_ and its name in capitals (AIRLOCK_TOKEN_FILE), every flag of
gateway from AIRLOCK_GATEWAY_ and its name (AIRLOCK_GATEWAY_LISTEN), and the
admin commands' --state from AIRLOCK_STATE.

Exit status: 0 success; 1 the command failed (a --check found a problem,
whois found no lease); 2 bad command line (unknown command or flag, wrong
arguments). airlock run returns its job's status (128+N if a signal N
killed it), or 125 if airlock itself failed (bad flags included), 126 if
the job's command is not executable, 127 if it was not found.`),
		Version:           version.Get().String(),
		Args:              noArgs,
		RunE:              needSubcommand,
		SilenceErrors:     true,
		SilenceUsage:      true,
		DisableAutoGenTag: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return applyEnv(cmd, os.Getenv)
		},
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(
		newRunCmd(stdout, stderr),
		newGatewayCmd(stdout, stderr),
		newTokenCmd(stdout, stderr),
		newWhoisCmd(stdout, stderr),
		newStatusCmd(stdout, stderr),
		newFlowsCmd(stdout, stderr),
		newKickCmd(stdout, stderr),
		newCaptureCmd(stdout, stderr),
		newDBCmd(stdout),
		newVersionCmd(stdout),
	)
	return root
}

// newVersionCmd is `airlock version`.
func newVersionCmd(stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "print the version, commit, build date and Go version",
		Args:  noArgs,
	}
	asJSON := jsonFlag(cmd, "the build information")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		v := version.Get()
		if *asJSON {
			return printJSON(stdout, v)
		}
		commit := v.Commit
		if v.Modified {
			commit += " (modified)"
		}
		fmt.Fprintf(stdout, "version:  %s\ncommit:   %s\ndate:     %s\ngo:       %s\nplatform: %s\n",
			v.Version, orDash(commit), orDash(v.Date), v.GoVersion, v.Platform)
		return nil
	}
	return cmd
}

// newLogger returns a text logger on w at the named level.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	return newLoggerFormat(w, level, logFormatText)
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}
