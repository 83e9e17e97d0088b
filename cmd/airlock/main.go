// Command airlock is a rootless VPN and egress gateway for batch jobs:
// `airlock gateway` runs the gateway in the site's DMZ, `airlock run -- CMD`
// runs CMD on a compute node with all its traffic carried through it, and
// `airlock token` manages join tokens.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/nsexec"
	"github.com/airlock-vpn/airlock/internal/seccompnotify"
	"github.com/airlock-vpn/airlock/internal/usernet"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

// exitError carries a process exit status through run.
type exitError struct{ code int }

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", e.code) }

func main() {
	// A re-executed namespace child sets up the job's namespace and execs
	// the job; it never returns here.
	nsexec.Init()
	// So does the gateway's private namespace child (--tcp-stack kernel).
	usernet.Init()
	// A re-executed seccomp shim installs the job's connect filter and
	// execs the job; it never returns here either.
	seccompnotify.Init()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	if err := root.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "airlock: %v\n", err)
		return 2
	}
	err := root.Run(context.Background())
	var ee exitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, flag.ErrHelp):
		return 2
	default:
		fmt.Fprintf(stderr, "airlock: %v\n", err)
		return 1
	}
}

func newRoot(stdout, stderr io.Writer) *ffcli.Command {
	rootFS := flag.NewFlagSet("airlock", flag.ContinueOnError)
	rootFS.SetOutput(stderr)
	return &ffcli.Command{
		Name:       "airlock",
		ShortUsage: "airlock <subcommand> [flags] [args...]",
		ShortHelp:  "rootless VPN and egress gateway for batch jobs",
		LongHelp: strings.TrimSpace(`
Airlock carries all network traffic of an unmodified batch job through one
gateway in the site's DMZ, with no root on the compute node.

  airlock gateway --state DIR          run the gateway (admin)
  airlock gateway reload --state DIR   reload its --config file (admin)
  airlock token create --state DIR     make a join token (admin)
  airlock status --state DIR           the running gateway's jobs and traffic (admin)
  airlock flows --state DIR            its flows; airlock kick ends a job's lease
  airlock capture --state DIR JOB      a job's packets as pcap (admin)
  airlock run -- CMD [ARGS...]         run a job through the gateway

Jobs read AIRLOCK_GATEWAY, AIRLOCK_PIN (both in the gateway's join.env) and
AIRLOCK_TOKEN from the environment.`),
		FlagSet: rootFS,
		Subcommands: []*ffcli.Command{
			newRunCmd(stderr),
			newGatewayCmd(stdout, stderr),
			newTokenCmd(stdout, stderr),
			newWhoisCmd(stdout, stderr),
			newStatusCmd(stdout, stderr),
			newFlowsCmd(stdout, stderr),
			newKickCmd(stdout, stderr),
			newCaptureCmd(stdout, stderr),
			{
				Name:       "version",
				ShortUsage: "airlock version",
				ShortHelp:  "print the version",
				Exec: func(context.Context, []string) error {
					fmt.Fprintln(stdout, version)
					return nil
				},
			},
		},
		Exec: func(context.Context, []string) error { return flag.ErrHelp },
	}
}

// newLogger returns a text logger on w at the named level.
func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	return newLoggerFormat(w, level, logFormatText)
}

// signalContext is cancelled on SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

// envOption reads AIRLOCK_<FLAG> for flags not set on the command line.
func envOption() ff.Option { return ff.WithEnvVarPrefix("AIRLOCK") }
