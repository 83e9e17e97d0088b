// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/test/impair"
)

// runImpair runs the impairment relay between interfaces a and b with the
// JSON-encoded impair.Config cfg, printing "ready" on stdout once its
// sockets are bound. It exits on SIGTERM or SIGINT, and when its parent
// (the test that started it) dies: by PR_SET_PDEATHSIG, and by a check of
// its parent's PID every 200 ms in case the signal was missed.
func runImpair(a, b, cfg string) error {
	ppid := os.Getppid()
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("set parent-death signal: %w", err)
	}
	if os.Getppid() != ppid {
		return fmt.Errorf("parent %d exited before the relay started", ppid)
	}
	var c impair.Config
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		return fmt.Errorf("parse impairment config: %w", err)
	}
	for _, ifname := range []string{a, b} {
		if err := impair.DisableOffloads(ifname); err != nil {
			return err
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if os.Getppid() != ppid {
					cancel()
					return
				}
			}
		}
	}()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	log.Info("impair relay", "a", a, "b", b, "config", c.String())
	r := &impair.Relay{A: a, B: b, Config: c, Logger: log, Ready: func() { fmt.Println("ready") }}
	return r.Run(ctx)
}

// offloadsOff disables transmit checksum offload, TSO, GSO and GRO on the
// named interfaces of the current network namespace.
func offloadsOff(ifnames []string) error {
	for _, n := range ifnames {
		if err := impair.DisableOffloads(n); err != nil {
			return err
		}
	}
	return nil
}
