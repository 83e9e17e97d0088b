// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/control"
)

func newRunCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "run [flags] -- CMD [ARGS...]",
		Short: "run CMD with all its traffic carried through the gateway",
		Long: `Runs CMD in a new unprivileged user+network+mount namespace whose only
interface is a tunnel to the gateway. CMD keeps your uid; its exit status is
returned (128+N if killed by signal N). airlock's own failures exit 125.
Flags end at CMD; a -- before CMD is good practice.

With --expose PORT[/tcp|/udp], connections to a port of the job's block on
the gateway's public address reach the job's PORT; the job finds that
address in the variable AIRLOCK_EXPOSED_PORT=IP:PUBPORT, PORT being the
number (AIRLOCK_EXPOSED_8080, AIRLOCK_EXPOSED_8080_UDP for udp); for a
dual-stack job the value lists both families, IPv4 first
(IP:PUBPORT,[IP6]:PUBPORT). airlock prints them on stderr.

The join token is best given in a file (--token-file, AIRLOCK_TOKEN_FILE) or
in AIRLOCK_TOKEN, never as --token, which every user of the node can read
in ps. The job's environment never holds AIRLOCK_TOKEN or
AIRLOCK_TOKEN_FILE, and airlock's own memory and environment are closed to
the job; the token file itself stays readable by the job's user.

The job's outside connections leave from AIRLOCK_EGRESS_ADDR with source
ports in AIRLOCK_EGRESS_PORTS=LO-HI (the gateway's block size, or at least
--ports N if given; the gateway's admin sets the limit). Those variables are
fixed at the job's start; the file named by AIRLOCK_EGRESS_FILE always holds
the current ones (and AIRLOCK_GATEWAY), also after a failover to another
gateway.

Where user namespaces or /dev/net/tun are unavailable, --mode auto (the
default) falls back, in this order, to: seccomp (connect() of every process
is caught by a seccomp user-notification filter, Linux >= 5.9), preload (an
LD_PRELOAD library, dynamically linked programs only) and proxy (only the
http_proxy/https_proxy/ALL_PROXY variables). The job then runs in the host's
network namespace and reaches the tunnel through a user-space TCP/IP stack
in airlock. airlock prints one line naming the mode, and for a fallback why
and what is not covered.

WireGuard runs over UDP; --transport auto (the default) switches to TCP/TLS
on the gateway's control port when no handshake completes over UDP within
--transport-timeout, and logs which it chose. If the gateway goes away the
job keeps running and airlock reconnects; with several gateways
(--gateway a:8443,b:8443) it joins the least loaded and moves to another
when its gateway is lost for --failover-after. A gateway that direct TCP
cannot reach is dialled through the site's web proxy named by HTTPS_PROXY
(NO_PROXY respected; credentials from the URL, AIRLOCK_PROXY_AUTH_FILE or
~/.netrc), with TLS and the pin end to end; UDP cannot pass it, so such a
job runs on the TCP transport. The job's network is then the tunnel, which
does not reach the site's proxy: the proxy variables are removed from the
job's environment, as the mode line says (--job-proxy-env).

In --mode netns, fusermount3 (squashfuse, cvmfsexec, sshfs) works inside
the job through airlock's stand-in, and containers the job starts
(bwrap, unshare -U) reach the outside through the tunnel.

Every flag is also read from the environment, as AIRLOCK_ and the flag's
name in capitals (AIRLOCK_TOKEN_FILE for --token-file), when the command
line does not set it, and then from the site file (--site-file, default
` + client.DefaultSiteFile + `): AIRLOCK_NAME=VALUE lines the node's admin
sets for every job, as the SPANK plugin's and the HTCondor wrapper's env
files (one file can serve all three). A job that sets --gateway or --pin
takes neither from the site file, nor --token or --token-file if it sets
one of them. The site file must be owned by root (or you) and writable by
no one else; a world-readable one holding AIRLOCK_TOKEN, or naming a
world-readable AIRLOCK_TOKEN_FILE, is refused. --check prints where each
setting came from.`,
		Example: `  AIRLOCK_GATEWAY=gw.example.org:8443 AIRLOCK_PIN=sha256:... AIRLOCK_TOKEN_FILE=~/.airlock-token \
    airlock run -- curl -sI https://example.org
  airlock run --check --json`,
	}
	fs := cmd.Flags()
	var cfg client.Config
	fs.StringVar(&cfg.Gateway, "gateway", "", "gateway `HOST:PORT`, or several comma-separated: the least loaded is joined, the others take over when it is lost")
	fs.StringVar(&cfg.Pin, "pin", "", "gateway certificate fingerprint sha256:HEX; one for all gateways or one per gateway, comma-separated")
	fs.StringVar(&cfg.Token, "token", "", "join token; discouraged on the command line, where every user of the node sees it (ps): use --token-file or AIRLOCK_TOKEN")
	fs.StringVar(&cfg.TokenFile, "token-file", "", "`FILE` holding the join token, read once at start")
	fs.DurationVar(&cfg.JoinTimeout, "join-timeout", client.DefaultJoinTimeout, "how long the job waits for a gateway that cannot take it yet (busy, draining, over a rate or quota, unreachable) before it gives up; a definite refusal (bad token, ban, full gateway) ends it at once")
	fs.StringVar(&cfg.Transport, "transport", client.TransportAuto, "WireGuard transport: auto (UDP, TCP/TLS on the control port if no UDP handshake within --transport-timeout), udp or tcp")
	fs.DurationVar(&cfg.TransportTimeout, "transport-timeout", client.DefaultTransportTimeout, "auto transport: how long to wait for a handshake over UDP before switching to TCP")
	fs.DurationVar(&cfg.FailoverAfter, "failover-after", client.DefaultFailoverAfter, "with several gateways: how long the gateway may be unreachable before the job moves to another")
	fs.Var((*exposeFlag)(&cfg.Expose), "expose", "expose the job's `PORT[/tcp|/udp]` on the gateway's public address; repeatable or comma-separated")
	fs.IntVar(&cfg.Ports, "ports", 0, "how many egress ports the job needs, e.g. 1024 for a data mover with many connections; the gateway grants whole blocks up to its --max-block-size or refuses (default: the gateway's block size)")
	mode := fs.String("mode", "auto", "how the job's traffic reaches the tunnel: auto, netns, seccomp, preload, proxy")
	fs.StringVar(&cfg.Preload, "preload", "", "LD_PRELOAD library for --mode preload; default: "+client.PreloadLibrary+" next to airlock")
	fs.StringVar(&cfg.Attest, "attest", client.AttestAuto, "attested identity: auto (a MUNGE credential with every join to a gateway that checks them, where this node runs munged; then no token is needed), munge (always; no munged is an error) or off")
	fs.StringVar(&cfg.MungeSocket, "munge-socket", "", "this node's munged socket for the join's MUNGE credential (default /run/munge/munge.socket.2; a site with a dedicated node+gateway key names that munged's socket)")
	fs.StringVar(&cfg.Bearer, "bearer", client.BearerAuto, "the job's bearer token (WLCG token discovery: BEARER_TOKEN, BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID, /tmp/bt_u$UID): auto (presented to gateways that trust token issuers, with the join and again, re-read, at every renewal; then no join token is needed) or off")
	fs.StringVar(&cfg.JobProxyEnv, "job-proxy-env", client.JobProxyEnvAuto, "the site's web proxy variables (HTTPS_PROXY, HTTP_PROXY, ALL_PROXY and lower-case) in the job's environment: auto (removed when the gateway is reached through that proxy, which the job's network, the tunnel, does not reach, unless the gateway's bypass list covers the proxy; the mode line says so), keep or drop")
	logLevel := fs.String("log-level", "warn", "log level: debug, info, warn, error")
	logFormat := fs.String("log-format", logFormatText, "log format: text or json (one JSON object per line)")
	siteFile := fs.String(siteFileFlag, client.DefaultSiteFile, "site file `FILE` of AIRLOCK_NAME=VALUE defaults for what the command line and the environment leave unset; an absent default file is no error")
	check := fs.Bool("check", false, "check this node and the gateway (namespaces, /dev/net/tun, /dev/fuse, containers in jobs, limits, TCP directly or through HTTPS_PROXY, pin, join, UDP), print ok/warn/PROBLEM with fixes, exit 1 on a problem; runs no command")
	asJSON := jsonFlag(cmd, "the --check report")
	flagsEndAtArgs(cmd)
	envPrefix(cmd, "AIRLOCK")
	_ = cmd.MarkFlagFilename("token-file")
	_ = cmd.MarkFlagFilename(siteFileFlag, "env")
	_ = cmd.MarkFlagFilename("preload", "so")
	enumFlag(cmd, "mode", "auto", "netns", "seccomp", "preload", "proxy")
	enumFlag(cmd, "transport", client.TransportAuto, client.TransportUDP, client.TransportTCP)
	enumFlag(cmd, "attest", client.AttestAuto, client.AttestMunge, client.AttestOff)
	enumFlag(cmd, "bearer", client.BearerAuto, client.BearerOff)
	enumFlag(cmd, "job-proxy-env", client.JobProxyEnvAuto, client.JobProxyEnvKeep, client.JobProxyEnvDrop)
	enumFlag(cmd, "log-level", "debug", "info", "warn", "error")
	enumFlag(cmd, "log-format", logFormatText, logFormatJSON)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		settings, err := applySiteFile(cmd, *siteFile, os.Getenv, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "airlock: %v\n", err)
			return exitError{client.ExitFailure}
		}
		log, err := newLoggerFormat(stderr, *logLevel, *logFormat)
		if err != nil {
			fmt.Fprintf(stderr, "airlock: %v\n", err)
			return exitError{client.ExitFailure}
		}
		cfg.Logger = log
		if sourceOf(settings, "token") == "command line" {
			fmt.Fprintln(stderr, "airlock: warning: --token on the command line is visible to every user of this node (ps); use --token-file PATH or AIRLOCK_TOKEN")
		}
		m, err := client.ParseMode(*mode)
		if err != nil {
			fmt.Fprintf(stderr, "airlock: %v\n", err)
			return exitError{client.ExitFailure}
		}
		cfg.Mode = m
		if *check {
			if len(args) > 0 {
				return usagef("--check runs no command, got %q", args)
			}
			return runCheck(ctx, cfg, settingsReport(settings), stdout, *asJSON)
		}
		cfg.Args = args
		cfg.Stderr = stderr
		boundProcs(os.Getenv("GOMAXPROCS"))
		code, err := client.Run(ctx, cfg)
		if err != nil {
			fmt.Fprintf(stderr, "airlock: %v\n", err)
		}
		return exitError{code}
	}
	return cmd
}

// exposeFlag collects --expose values; each may be a comma-separated list.
type exposeFlag []control.Port

func (f *exposeFlag) String() string {
	if f == nil {
		return ""
	}
	var s []string
	for _, p := range *f {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

func (f *exposeFlag) Type() string { return "PORT[/PROTO]" }

func (f *exposeFlag) Set(v string) error {
	for _, spec := range strings.Split(v, ",") {
		p, err := control.ParsePort(spec)
		if err != nil {
			return err
		}
		*f = append(*f, p)
	}
	return nil
}

// boundProcs keeps airlock run to client.MaxProcs threads of Go code (the
// GOMAXPROCS environment variable, env, overrides it): its data path needs
// one per direction, and every core it takes is taken from the job.
func boundProcs(env string) {
	if env == "" && runtime.GOMAXPROCS(0) > client.MaxProcs {
		runtime.GOMAXPROCS(client.MaxProcs)
	}
}
