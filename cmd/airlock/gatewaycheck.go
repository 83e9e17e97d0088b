// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/fleet"
	"github.com/airlock-vpn/airlock/internal/forward/kernel"
	"github.com/airlock-vpn/airlock/internal/gateway"
	"github.com/airlock-vpn/airlock/internal/ipfamily"
	"github.com/airlock-vpn/airlock/internal/preflight"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// gatewayCheck is airlock gateway --check: what this host offers the
// gateway configured by cfg, without starting it.
func gatewayCheck(cfg gateway.Config, w io.Writer, asJSON bool) error {
	h := preflight.System()
	rep := preflight.Report{h.StateDir(cfg.StateDir), preflight.Listen(cfg.Listen)}
	if cfg.ConfigFile != "" {
		rep = append(rep, configFileCheck(cfg.ConfigFile)...)
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
	rep = append(rep, h.OpenFiles(4096, 65536, "one per flow, and two per TCP flow in user mode"), h.SocketBuffers(tunnel.SocketBufferSize))
	if cfg.Store.URL != "" {
		rep = append(rep, storeCheck(cfg.Store), fleetKeyCheck(cfg.Store.FleetKey))
	}
	return writeReport(w, rep, asJSON)
}

// configFileCheck checks the gateway's --config file as the gateway would at
// start: strict decoding and full validation.
func configFileCheck(path string) []preflight.Result {
	r := preflight.Result{Name: "config " + path}
	c, err := config.Load(path)
	if err != nil {
		r.Status, r.Detail = preflight.Problem, err.Error()
		r.Fix = "correct the file (docs/config.md, docs/gateway.example.toml); a running gateway keeps its old config on a bad reload"
		return []preflight.Result{r}
	}
	r.Detail = fmt.Sprintf("valid: %d policy rules, default %s", len(c.Policy.Rules), c.Policy.Default)
	out := []preflight.Result{r}
	// Token names are checked by the gateway, which knows its tokens.
	for _, w := range c.Warnings(nil) {
		loc := w.Key
		if w.Line > 0 {
			loc = fmt.Sprintf("line %d, %s", w.Line, w.Key)
		}
		out = append(out, preflight.Result{Name: "config " + loc, Status: preflight.Warn, Detail: w.Problem, Fix: w.Fix})
	}
	return out
}

// outsideAddrs are the addresses of cfg's gateway that face outside: those
// jobs' flows leave from (--egress-addr, or the default routes' sources).
func outsideAddrs(cfg gateway.Config) []netip.Addr {
	out := slices.Clone(cfg.EgressAddrs)
	for _, f := range ipfamily.All {
		if a, err := gateway.EgressSource(f); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// egressChecks are airlock gateway --check's lines on where jobs' flows
// leave from, per address family: a user-mode gateway without
// --egress-addr(6) uses the source of the host's default route of the
// family (IPv4 without one: the host's choice per destination; kernel
// mode cannot start; IPv6 without one: jobs get IPv4 only), and
// --egress-prefix needs its host setup (user mode: a local route; kernel
// mode: no local route, not on-link elsewhere).
func egressChecks(cfg gateway.Config) []preflight.Result {
	var out []preflight.Result
	for _, f := range ipfamily.All {
		name := strings.ToLower(f.Name) + " egress"
		switch {
		case f == ipfamily.V6 && cfg.NoIPv6:
		case f == ipfamily.V6 && cfg.EgressPrefix6.IsValid():
			out = append(out, prefix6Check(cfg))
		case slices.ContainsFunc(cfg.EgressAddrs, f.Contains):
		case f == ipfamily.V4 && len(cfg.Subnets) > 0 && !cfg.Subnets[0].Addr().Is4(): // an IPv6-only tunnel
		default:
			r := preflight.Result{Name: name, Status: preflight.OK}
			a, err := gateway.EgressSource(f)
			switch {
			case err == nil:
				r.Detail = fmt.Sprintf("jobs' %s flows leave from %s (the %s default route's source)", f, a, f)
			case f == ipfamily.V6:
				r.Status, r.Detail = preflight.Warn, fmt.Sprintf("jobs get IPv4 only: %v", err)
				r.Fix = "give this host an IPv6 default route, or set --egress-addr"
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

// prefix6Check is --egress-prefix's line: the host setup each egress mode
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

// fleetKeyCheck is gateway --check's item for --fleet-key: the key loads;
// without one, jobs are told of no other gateway.
func fleetKeyCheck(path string) preflight.Result {
	r := preflight.Result{Name: "fleet key"}
	if path == "" {
		r.Status, r.Detail = preflight.Warn, "no --fleet-key: this gateway tells its jobs of no other gateway of the fleet, so they do not fail over"
		r.Fix = "make one fleet key (airlock db fleet-key FILE), copy it (mode 0600) to every gateway and start each with --fleet-key FILE (docs/fleet.md)"
		return r
	}
	if _, err := fleet.LoadKey(path); err != nil {
		r.Status, r.Detail, r.Fix = preflight.Problem, err.Error(), "give every gateway the same key made by airlock db fleet-key, mode 0600 (docs/fleet.md)"
		return r
	}
	r.Status, r.Detail = preflight.OK, "loads: this gateway signs its member record, and jobs are told only of members it signed"
	return r
}

// storeCheck is gateway --check's item for --store: the database answers
// with the schema this airlock knows.
func storeCheck(sc gateway.StoreConfig) preflight.Result {
	r := preflight.Result{Name: "fleet database"}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	db, err := pgstore.Open(ctx, pgstore.Config{URL: sc.URL, PasswordFile: sc.PasswordFile, Insecure: sc.Insecure})
	switch {
	case errors.Is(err, pgstore.ErrSchemaOld):
		r.Status, r.Detail, r.Fix = preflight.Problem, err.Error(), "run airlock db migrate --store URL as the schema's owner (docs/fleet.md)"
	case errors.Is(err, pgstore.ErrSchemaNew):
		r.Status, r.Detail, r.Fix = preflight.Problem, err.Error(), "upgrade airlock on this host to the fleet's version"
	case err != nil:
		r.Status, r.Detail, r.Fix = preflight.Warn, err.Error(), "check --store, the password (--store-password-file, PGPASSWORD) and TLS; the gateway starts without the database with its copy of the fleet's tokens from a previous run, and a new gateway admits no job until it answers"
	default:
		defer db.Close()
		r.Status, r.Detail = preflight.OK, fmt.Sprintf("answers with schema version %d", pgstore.LatestVersion())
		missing, excess, err := db.GatewayPrivileges(ctx)
		switch {
		case err != nil:
			r.Status, r.Detail, r.Fix = preflight.Warn, err.Error(), "check the database role's privileges (docs/fleet.md)"
		case len(missing) > 0:
			r.Status = preflight.Problem
			r.Detail = fmt.Sprintf("the database role lacks what a gateway needs: %s", strings.Join(missing, ", "))
			r.Fix = fmt.Sprintf("run airlock db migrate --store OWNER_URL --gateway-role ROLE as the schema's owner: it grants %s what it needs (docs/fleet.md)", pgstore.GatewayRole)
		case len(excess) > 0:
			r.Status = preflight.Warn
			r.Detail = fmt.Sprintf("the database role may do an admin's work: %s; its password on this host is the keys to the site", strings.Join(excess, "; "))
			r.Fix = fmt.Sprintf("give this gateway a login role of its own in %s only: airlock db migrate --gateway-role ROLE (docs/fleet.md)", pgstore.GatewayRole)
		}
	}
	return r
}
