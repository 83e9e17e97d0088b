package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/preflight"
)

// runCheck is airlock run --check: what this node offers the mode asked
// for, and whether each gateway can be reached, joined and spoken to over
// UDP. It prints the report on w and fails when a check finds a problem.
func runCheck(ctx context.Context, cfg client.Config, w io.Writer) error {
	h := preflight.System()
	// Under --mode auto a missing namespace or TUN only means a fallback.
	miss, fallback := preflight.Problem, ""
	if cfg.Mode == client.ModeAuto {
		miss, fallback = preflight.Warn, "; --mode auto falls back to seccomp, preload or proxy"
	}
	var rep preflight.Report
	if cfg.Mode == client.ModeAuto || cfg.Mode == client.ModeNetns {
		rep = append(rep, h.UserNamespaces(miss, fallback), h.TUNDevice(miss, fallback))
	}
	rep = append(rep, h.OpenFiles(256, 1024, "airlock run needs a few dozen; the job gets the rest"))
	udpMiss := preflight.Warn
	if cfg.Transport == client.TransportUDP {
		udpMiss = preflight.Problem
	}
	pins := strings.Split(cfg.Pin, ",")
	for i, gw := range strings.Split(cfg.Gateway, ",") {
		gw = strings.TrimSpace(gw)
		if gw == "" {
			continue
		}
		pin := pins[0]
		if len(pins) > 1 && i < len(pins) {
			pin = pins[i]
		}
		rep = append(rep, preflight.Gateway(ctx, gw, strings.TrimSpace(pin), cfg.Token, udpMiss)...)
	}
	if strings.TrimSpace(cfg.Gateway) == "" {
		rep = append(rep, preflight.Result{Name: "gateway", Status: preflight.Problem, Detail: "none given",
			Fix: "set AIRLOCK_GATEWAY and AIRLOCK_PIN (from the gateway's join.env) and AIRLOCK_TOKEN"})
	}
	if err := rep.Write(w); err != nil {
		return err
	}
	if rep.Failed() {
		return exitError{1}
	}
	return nil
}

// gatewayCheck is airlock gateway --check: what this host offers the
// gateway configured by cfg, without starting it.
func gatewayCheck(cfg gateway.Config, w io.Writer) error {
	h := preflight.System()
	rep := preflight.Report{h.StateDir(cfg.StateDir), preflight.Listen(cfg.Listen)}
	if cfg.ConfigFile != "" {
		rep = append(rep, preflight.ConfigFile(cfg.ConfigFile))
	}
	if cfg.Egress == gateway.EgressKernel {
		r := preflight.Result{Name: "privileges", Status: preflight.OK, Detail: "running as root"}
		if h.UID != 0 {
			r = preflight.Result{Name: "privileges", Status: preflight.Problem, Detail: fmt.Sprintf("--egress kernel needs root or CAP_NET_ADMIN; running as uid %d", h.UID),
				Fix: "run as root, or use the default --egress user"}
		}
		rep = append(rep, r)
	} else {
		if cfg.TCPStack != gateway.TCPStackNetstack {
			miss, fallback := preflight.Warn, "; --tcp-stack auto falls back to the netstack (slower on lossy paths)"
			if cfg.TCPStack == gateway.TCPStackKernel {
				miss, fallback = preflight.Problem, ""
			}
			rep = append(rep, h.UserNamespaces(miss, fallback), h.TUNDevice(miss, fallback))
		}
		rep = append(rep, h.PingGroup(), h.PortBlocks(cfg.EgressPorts.Lo, cfg.EgressPorts.Hi, cfg.BlockSize))
	}
	rep = append(rep, ipv6Checks(cfg)...) // check6.go
	rep = append(rep, h.OpenFiles(4096, 65536, "one per flow, and two per TCP flow in user mode"))
	if err := rep.Write(w); err != nil {
		return err
	}
	if rep.Failed() {
		return exitError{1}
	}
	return nil
}
