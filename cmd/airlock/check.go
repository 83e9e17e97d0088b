// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/preflight"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

// runCheck is airlock run --check: what this node offers the mode asked
// for, and whether each gateway can be reached, joined and spoken to over
// UDP. It prints the report on w (as JSON with asJSON) and fails when a
// check finds a problem.
func runCheck(ctx context.Context, cfg client.Config, w io.Writer, asJSON bool) error {
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
	token, err := client.ResolveToken(cfg)
	if err != nil && (cfg.Token != "" || cfg.TokenFile != "") {
		rep = append(rep, preflight.Result{Name: "join token", Status: preflight.Problem, Detail: err.Error(),
			Fix: "give a readable --token-file (AIRLOCK_TOKEN_FILE) holding the token 'airlock token create' printed, or AIRLOCK_TOKEN; not both"})
	}
	pins, gws := strings.Split(cfg.Pin, ","), strings.Split(cfg.Gateway, ",")
	if len(gws) == 1 {
		pins = []string{strings.ReplaceAll(cfg.Pin, ",", "|")} // one gateway: any of its pins (key rotation)
	}
	for i, gw := range gws {
		gw = strings.TrimSpace(gw)
		if gw == "" {
			continue
		}
		pin := pins[0]
		if len(pins) > 1 && i < len(pins) {
			pin = pins[i]
		}
		rep = append(rep, preflight.Gateway(ctx, gw, strings.TrimSpace(pin), token, udpMiss)...)
	}
	if strings.TrimSpace(cfg.Gateway) == "" {
		rep = append(rep, preflight.Result{Name: "gateway", Status: preflight.Problem, Detail: "none given",
			Fix: "set AIRLOCK_GATEWAY and AIRLOCK_PIN (from the gateway's join.env) and AIRLOCK_TOKEN"})
	}
	return writeReport(w, rep, asJSON)
}

// gatewayCheck is airlock gateway --check: what this host offers the
// gateway configured by cfg, without starting it.
func gatewayCheck(cfg gateway.Config, w io.Writer, asJSON bool) error {
	h := preflight.System()
	rep := preflight.Report{h.StateDir(cfg.StateDir), preflight.Listen(cfg.Listen)}
	if cfg.ConfigFile != "" {
		rep = append(rep, preflight.ConfigFile(cfg.ConfigFile)...)
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
	if cfg.Store.URL != "" {
		rep = append(rep, storeCheck(cfg.Store))
	}
	return writeReport(w, rep, asJSON)
}

// checkJSON is a --check report as --json prints it.
type checkJSON struct {
	Checks   []checkResultJSON `json:"checks"`
	OK       int               `json:"ok"`
	Warnings int               `json:"warnings"`
	Problems int               `json:"problems"`
}

// checkResultJSON is one check; Status is "ok", "warn" or "problem".
type checkResultJSON struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
	Fix    string `json:"fix,omitempty"`
}

// writeReport prints rep as text or JSON and returns exitError{1} if a
// check found a problem.
func writeReport(w io.Writer, rep preflight.Report, asJSON bool) error {
	var err error
	if asJSON {
		out := checkJSON{Checks: []checkResultJSON{}}
		for _, r := range rep {
			out.Checks = append(out.Checks, checkResultJSON{Name: r.Name, Status: strings.ToLower(r.Status.String()), Detail: r.Detail, Fix: r.Fix})
			switch r.Status {
			case preflight.OK:
				out.OK++
			case preflight.Warn:
				out.Warnings++
			default:
				out.Problems++
			}
		}
		err = printJSON(w, out)
	} else {
		err = rep.Write(w)
	}
	if err != nil {
		return err
	}
	if rep.Failed() {
		return exitError{exitFailure}
	}
	return nil
}

// storeCheck is gateway --check's item for --store: the database answers
// with the schema this airlock knows.
func storeCheck(sc gateway.StoreConfig) preflight.Result {
	r := preflight.Result{Name: "fleet database"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := pgstore.Open(ctx, pgstore.Config{URL: sc.URL, PasswordFile: sc.PasswordFile})
	switch {
	case errors.Is(err, pgstore.ErrSchemaOld):
		r.Status, r.Detail, r.Fix = preflight.Problem, err.Error(), "run airlock db migrate --store URL as the schema's owner (docs/fleet.md)"
	case errors.Is(err, pgstore.ErrSchemaNew):
		r.Status, r.Detail, r.Fix = preflight.Problem, err.Error(), "upgrade airlock on this host to the fleet's version"
	case err != nil:
		r.Status, r.Detail, r.Fix = preflight.Warn, err.Error(), "check --store, the password (--store-password-file, PGPASSWORD) and TLS; the gateway starts without the database with its copy of the fleet's tokens from a previous run, and a new gateway admits no job until it answers"
	default:
		db.Close()
		r.Status, r.Detail = preflight.OK, fmt.Sprintf("answers with schema version %d", pgstore.LatestVersion())
	}
	return r
}
