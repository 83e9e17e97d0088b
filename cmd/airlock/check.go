// SPDX-License-Identifier: MIT

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/forward/kernel"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
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
		rep = append(rep, h.UserNamespaces(miss, fallback), h.TUNDevice(miss, fallback), h.NestedUserNamespaces(), h.FUSEDevice())
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
	rep = append(rep, bearerCheck(cfg)...)
	dial := client.NewDialer(cfg.Getenv, cfg.Logger)
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
		rep = append(rep, preflight.Gateway(ctx, gw, strings.TrimSpace(pin), token, udpMiss, dial)...)
	}
	if p, ok := dial.Path(strings.TrimSpace(gws[0])); ok {
		if note := client.JobProxyEnvNote(os.Environ(), cfg.JobProxyEnv, p.Proxy); note != "" {
			rep = append(rep, preflight.Result{Name: "job's proxy variables", Status: preflight.OK, Detail: note})
		}
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
	rep = append(rep, egressChecks(cfg)...)
	rep = append(rep, preflight.ControlOutside(cfg.Listen, outsideAddrs(cfg)))
	rep = append(rep, h.OpenFiles(4096, 65536, "one per flow, and two per TCP flow in user mode"))
	if cfg.Store.URL != "" {
		rep = append(rep, storeCheck(cfg.Store))
	}
	return writeReport(w, rep, asJSON)
}

// egressChecks are airlock gateway --check's lines on where jobs' flows
// leave from, per address family: a user-mode gateway without
// --egress-addr(6) uses the source of the host's default route of the
// family (IPv4 without one: the host's choice per destination; kernel
// mode cannot start; IPv6 without one: jobs get IPv4 only), and
// --egress-prefix6 needs its host setup (user mode: a local route; kernel
// mode: no local route, not on-link elsewhere).
func egressChecks(cfg gateway.Config) []preflight.Result {
	var out []preflight.Result
	for _, f := range ipfamily.All {
		name := strings.ToLower(f.Name) + " egress"
		switch {
		case f == ipfamily.V6 && cfg.NoIPv6:
		case f == ipfamily.V6 && cfg.EgressPrefix6.IsValid():
			out = append(out, prefix6Check(cfg))
		case f == ipfamily.V4 && cfg.EgressAddr.IsValid(), f == ipfamily.V6 && cfg.EgressAddr6.IsValid():
		default:
			r := preflight.Result{Name: name, Status: preflight.OK}
			a, err := gateway.EgressSource(f)
			switch {
			case err == nil:
				r.Detail = fmt.Sprintf("jobs' %s flows leave from %s (the %s default route's source)", f, a, f)
			case f == ipfamily.V6:
				r.Status, r.Detail = preflight.Warn, fmt.Sprintf("jobs get IPv4 only: %v", err)
				r.Fix = "give this host an IPv6 default route, or set --egress-addr6"
			case cfg.Egress == gateway.EgressKernel:
				r.Status, r.Detail = preflight.Problem, fmt.Sprintf("kernel egress needs the public address to source-NAT to: %v", err)
				r.Fix = "set --egress-addr, or give this host a default route"
			default:
				r.Status, r.Detail = preflight.Warn, fmt.Sprintf("jobs' IPv4 flows leave from whatever source the host picks per destination: %v", err)
				r.Fix = "set --egress-addr, or give this host a default route"
			}
			out = append(out, r)
		}
	}
	return out
}

// outsideAddrs are the addresses of cfg's gateway that face outside: those
// jobs' flows leave from (--egress-addr, or the default routes' sources).
func outsideAddrs(cfg gateway.Config) []netip.Addr {
	out := append([]netip.Addr{cfg.EgressAddr, cfg.EgressAddr6}, cfg.EgressAddrs...)
	for _, f := range ipfamily.All {
		if a, err := gateway.EgressSource(f); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// prefix6Check is --egress-prefix6's line: the host setup each egress mode
// needs for jobs' own IPv6 addresses.
func prefix6Check(cfg gateway.Config) preflight.Result {
	p := cfg.EgressPrefix6
	if cfg.Egress == gateway.EgressKernel {
		r := preflight.Result{Name: "egress prefix6", Status: preflight.OK, Detail: fmt.Sprintf("%s is routed to the TUN: jobs' IPv6 flows leave from their own addresses (the site must route it to this host)", p)}
		if msgs := kernel.CheckPrefix6(p, cmp.Or(cfg.TUN, kernel.DefaultName)); len(msgs) > 0 {
			r.Status, r.Detail = preflight.Problem, strings.Join(msgs, "; ")
		}
		return r
	}
	if err := gateway.CheckLocalPrefix6(p, netip.Addr{}); err != nil {
		return preflight.Result{Name: "egress prefix6", Status: preflight.Problem, Detail: err.Error(),
			Fix: fmt.Sprintf("as root: ip -6 route add local %s dev lo", p)}
	}
	return preflight.Result{Name: "egress prefix6", Status: preflight.OK, Detail: fmt.Sprintf("%s is a local route: jobs' IPv6 flows leave from their own addresses", p)}
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

// bearerCheck reports the job's bearer token, if airlock run would find
// one: where, whose, and until when (its signature is the gateway's to
// check).
func bearerCheck(cfg client.Config) []preflight.Result {
	bt, err := client.FindBearer(cfg)
	r := preflight.Result{Name: "bearer token"}
	switch {
	case err != nil:
		r.Status, r.Detail = preflight.Problem, err.Error()
		r.Fix = "the pilot must give the job a readable token of its own (BEARER_TOKEN_FILE, $XDG_RUNTIME_DIR/bt_u$UID, mode 0600), or run with --bearer off"
	case bt.From == "":
		return nil // none: joins use the join token or MUNGE
	case !bt.Expires.IsZero() && time.Now().After(bt.Expires):
		r.Status = preflight.Warn
		r.Detail = fmt.Sprintf("from %s: issuer %s, subject %s, expired at %s", human(bt.From), human(bt.Issuer), human(bt.Subject), bt.Expires.UTC().Format(time.RFC3339))
		r.Fix = "the pilot must refresh the token file before the token expires"
	default:
		r.Status = preflight.OK
		r.Detail = fmt.Sprintf("from %s: issuer %s, subject %s, expires %s; presented to gateways that trust its issuer (--bearer)", human(bt.From), human(bt.Issuer), human(bt.Subject), bt.Expires.UTC().Format(time.RFC3339))
	}
	return []preflight.Result{r}
}
