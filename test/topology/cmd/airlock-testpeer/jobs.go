// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/loadgen"
)

// runJobs is `airlock-testpeer jobs`: N simulated jobs in this process
// (test/loadgen) against one gateway. It prints one JSON report line
// (loadgen.Report) when every job has started ("phase":"start"), another
// on SIGUSR1 after probing every job's traffic until it flows
// ("phase":"probe": after a gateway restart), one on SIGUSR2 with the
// counters so far, and a last one ("phase":"end") when -hold is over or on
// SIGTERM, after releasing every lease.
func runJobs(args []string) error {
	fs := flag.NewFlagSet("jobs", flag.ContinueOnError)
	gw := fs.String("gateway", os.Getenv("AIRLOCK_GATEWAY"), "gateway HOST:PORT, or several comma-separated: each job joins the least loaded and fails over like airlock run")
	pin := fs.String("pin", os.Getenv("AIRLOCK_PIN"), "gateway fingerprint, or one per gateway comma-separated")
	failover := fs.Duration("failover-after", 0, "with several gateways: how long a job's gateway may be lost before it moves (default: airlock run's)")
	token := fs.String("token", os.Getenv("AIRLOCK_TOKEN"), "join token")
	n := fs.Int("n", 100, "number of jobs")
	over := fs.Duration("over", 0, "spread the jobs' starts over this long")
	hold := fs.Duration("hold", time.Minute, "keep the jobs running this long after they started")
	echo := fs.String("echo", "", "UDP echo server ADDR:PORT to send a datagram to through each job's tunnel")
	every := fs.Duration("echo-every", time.Minute, "each job's echo interval while running (0: only at start)")
	timeout := fs.Duration("timeout", 10*time.Second, "bound of each request, the first handshake and each echo")
	joinTimeout := fs.Duration("join-timeout", 0, "how long a job waits for a gateway that cannot take it yet (default: airlock run's)")
	transport := fs.String("transport", "", "WireGuard transport: auto (default), udp or tcp, as airlock run's --transport")
	prefix := fs.String("prefix", "load", "batch job id prefix")
	probeLimit := fs.Duration("probe-limit", 60*time.Second, "SIGUSR1 probe: give up on a job after this long")
	logLevel := fs.String("log-level", "error", "log level of the jobs' WireGuard devices")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return err
	}
	raiseNoFile()
	cfg := loadgen.Config{
		Logger:  slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})),
		Gateway: *gw, Pin: *pin, Token: *token, N: *n, Over: *over,
		EchoEvery: *every, Timeout: *timeout, JobPrefix: *prefix, FailoverAfter: *failover,
		JoinTimeout: *joinTimeout, Transport: *transport,
	}
	if *echo != "" {
		ap, err := netip.ParseAddrPort(*echo)
		if err != nil {
			return fmt.Errorf("-echo: %w", err)
		}
		cfg.Echo = ap
	}
	g, err := loadgen.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGTERM, syscall.SIGINT)
	enc := json.NewEncoder(os.Stdout)
	_ = enc.Encode(g.Start(ctx))
	end := time.After(*hold)
	for {
		select {
		case s := <-sigs:
			switch s {
			case syscall.SIGUSR1:
				_ = enc.Encode(g.Probe(ctx, *probeLimit))
				continue
			case syscall.SIGUSR2:
				_ = enc.Encode(g.Snapshot())
				continue
			}
		case <-end:
		}
		break
	}
	r := g.Snapshot()
	r.Phase = "end"
	cancel()
	g.Close()
	return enc.Encode(r)
}

// raiseNoFile raises the open-files limit as far as allowed: every job
// holds a UDP socket (two: IPv4 and IPv6) and a TLS connection.
func raiseNoFile() {
	var r unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_NOFILE, &r) != nil {
		return
	}
	want := unix.Rlimit{Cur: 1 << 20, Max: 1 << 20}
	if unix.Setrlimit(unix.RLIMIT_NOFILE, &want) != nil {
		r.Cur = r.Max
		_ = unix.Setrlimit(unix.RLIMIT_NOFILE, &r)
	}
}
