// SPDX-License-Identifier: MIT

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/preflight"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// runCheck is airlock run --check: what this node offers the mode asked
// for, and whether each gateway can be reached, joined and spoken to over
// UDP, after rep (where the settings came from). It prints the report on
// w (as JSON with asJSON) and fails when a check finds a problem.
func runCheck(ctx context.Context, cfg client.Config, rep preflight.Report, w io.Writer, asJSON bool) error {
	h := preflight.System()
	// Under --mode auto a missing namespace or TUN only means a fallback.
	miss, fallback := preflight.Problem, ""
	if cfg.Mode == client.ModeAuto {
		miss, fallback = preflight.Warn, "; --mode auto falls back to seccomp, preload or proxy"
	}
	if cfg.Mode == client.ModeAuto || cfg.Mode == client.ModeNetns {
		rep = append(rep, h.UserNamespaces(miss, fallback), h.TUNDevice(miss, fallback), h.NestedUserNamespaces(), h.FUSEDevice())
	}
	rep = append(rep, h.OpenFiles(256, 1024, "airlock run needs a few dozen; the job gets the rest"), h.SocketBuffers(tunnel.SocketBufferSize))
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
			Fix: "set AIRLOCK_GATEWAY and AIRLOCK_PIN (from the gateway's join.env) in the environment or the site file (--site-file, default " + client.DefaultSiteFile + "), and AIRLOCK_TOKEN"})
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
