package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/peterbourgon/ff/v3"
	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/client"
)

func newRunCmd(stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock run", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg client.Config
	fs.StringVar(&cfg.Gateway, "gateway", "", "gateway HOST:PORT (env AIRLOCK_GATEWAY)")
	fs.StringVar(&cfg.Pin, "pin", "", "gateway certificate fingerprint sha256:HEX (env AIRLOCK_PIN)")
	fs.StringVar(&cfg.Token, "token", "", "join token (env AIRLOCK_TOKEN)")
	fs.DurationVar(&cfg.JoinTimeout, "join-timeout", 15*time.Second, "how long to wait for the gateway to answer a join")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error (env AIRLOCK_LOG_LEVEL)")
	return &ffcli.Command{
		Name:       "run",
		ShortUsage: "airlock run [flags] -- CMD [ARGS...]",
		ShortHelp:  "run CMD with all its traffic carried through the gateway",
		LongHelp: `Runs CMD in a new unprivileged user+network+mount namespace whose only
interface is a tunnel to the gateway. CMD keeps your uid; its exit status is
returned (128+N if killed by signal N). airlock's own failures exit 125.`,
		FlagSet: fs,
		Options: []ff.Option{envOption()},
		Exec: func(ctx context.Context, args []string) error {
			log, err := newLogger(stderr, *logLevel)
			if err != nil {
				return exitError{client.ExitFailure}
			}
			cfg.Logger = log
			cfg.Args = args
			code, err := client.Run(ctx, cfg)
			if err != nil {
				fmt.Fprintf(stderr, "airlock: %v\n", err)
			}
			return exitError{code}
		},
	}
}
