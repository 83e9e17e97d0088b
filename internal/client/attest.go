// SPDX-License-Identifier: MIT

package client

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/airlock-vpn/airlock/internal/attest"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/munge"
)

// Attested identity on the node: at a gateway that checks MUNGE
// credentials (its load report says "munge"), every join carries a join
// credential that airlock run has this node's munged make just before the
// join: it names the gateway (its pin) and the join's WireGuard key, and
// munged adds airlock run's uid and gid. The first join also carries the
// job credential root made for the job (the SPANK plugin puts it in
// AIRLOCK_MUNGE_JOB), bound into the join credential by its SHA-256; it
// is spent there, so later joins (a rejoin that proves the lease keeps the
// job's attestation; a failover records the job id as claimed) carry none.
// Neither credential reaches the job: the job's environment loses
// AIRLOCK_MUNGE_JOB with the token variables.

// Attest modes of Config.Attest.
const (
	// AttestAuto makes join credentials for gateways that check them,
	// where this node has a munged (its socket exists); without one, it
	// joins with the token alone.
	AttestAuto = "auto"
	// AttestMunge always makes them; no munged is an error.
	AttestMunge = "munge"
	// AttestOff never does.
	AttestOff = "off"
)

// EnvMungeJob carries root's job credential from the SPANK plugin to
// airlock run.
const EnvMungeJob = "AIRLOCK_MUNGE_JOB"

// nodeAttest is a session's MUNGE state. It is owned by the session.
type nodeAttest struct {
	mode string
	mc   munge.Client
	// jobCred is root's job credential, "" once spent or if none.
	jobCred string
	// warned is set once a failure in auto mode was logged.
	warned bool
	// named is set when the site named the socket (--munge-socket,
	// AIRLOCK_MUNGE_SOCKET): that munged or none.
	named bool
}

// newNodeAttest checks the mode and finds munged.
func newNodeAttest(mode, socket, jobCred string) (*nodeAttest, error) {
	switch mode {
	case "":
		mode = AttestAuto
	case AttestAuto, AttestMunge, AttestOff:
	default:
		return nil, fmt.Errorf("bad --attest %q: want auto, munge or off", mode)
	}
	a := &nodeAttest{mode: mode, mc: munge.Client{Socket: socket}, jobCred: jobCred, named: socket != ""}
	if mode == AttestOff {
		a.jobCred = ""
		return a, nil
	}
	if socket == "" {
		socket = munge.DefaultSocket
	}
	if _, err := os.Stat(socket); err != nil {
		switch {
		case mode == AttestMunge:
			return nil, fmt.Errorf("--attest munge: no munged socket at %s (%v): start munged, or name its socket with --munge-socket or AIRLOCK_MUNGE_SOCKET", socket, err)
		case a.named:
			// The site named its munged: never fall back to another
			// one, nor silently to no credential.
			return nil, fmt.Errorf("no munged socket at %s, named by --munge-socket or AIRLOCK_MUNGE_SOCKET (%v): start that munged, fix the name, or join without a credential (--attest off)", socket, err)
		case jobCred != "":
			return nil, fmt.Errorf("this job carries root's job credential (%s) but there is no munged socket at %s (MUNGE's default; %v) to make the join's own: name the site's node+gateway munged with --munge-socket or AIRLOCK_MUNGE_SOCKET", EnvMungeJob, socket, err)
		}
		a.mode = AttestOff // auto, without munged: tokens only
	}
	return a, nil
}

// socket is the munged socket the session's credentials come from, as
// its messages name it.
func (a *nodeAttest) socket() string {
	if a.named {
		return a.mc.Socket
	}
	return munge.DefaultSocket + " (MUNGE's default: no --munge-socket or AIRLOCK_MUNGE_SOCKET was given)"
}

// explain adds to a gateway's refusal of a credential which munged made
// it, so that a node whose default munged holds another key than the
// gateway's (the cluster's own, beside a dedicated node+gateway munged)
// says which socket to name.
func (a *nodeAttest) explain(req control.JoinRequest, err error) error {
	if a == nil || req.Attest == nil || !errors.Is(err, control.ErrAttestation) {
		return err
	}
	return fmt.Errorf("%w (the join's credential came from the munged at %s)", err, a.socket())
}

// possible reports whether joins may carry credentials, so that a missing
// token is not an error yet.
func (a *nodeAttest) possible() bool { return a != nil && a.mode != AttestOff }

// sign adds the credentials to a join of req at the gateway gw. In auto
// mode a failure to make one is logged once and the join goes on
// without.
func (a *nodeAttest) sign(ctx context.Context, s *Session, gw *gatewayEntry, req control.JoinRequest) (control.JoinRequest, error) {
	req.Attest = nil
	if a == nil || a.mode == AttestOff || (a.mode == AttestAuto && !checks(ctx, gw)) {
		return req, nil
	}
	cred, err := attest.MakeJoin(ctx, a.mc, gw.cc.Pin(), req.PublicKey, a.jobCred)
	if err != nil {
		if a.mode == AttestMunge {
			return req, err
		}
		if !a.warned {
			a.warned = true
			s.log.Warn("this node's munged made no MUNGE credential for the join; joining with the token alone", "gateway", gw.addr, "err", err)
		}
		return req, nil
	}
	req.Attest = &control.Attest{Munge: cred, MungeJob: a.jobCred}
	return req, nil
}

// checks reports whether gw checks MUNGE credentials, asking its load
// report if the session has none yet (a job given one gateway).
func checks(ctx context.Context, gw *gatewayEntry) bool {
	if gw.checks == "" {
		hctx, cancel := context.WithTimeout(ctx, healthTimeout)
		h, err := gw.cc.Health(hctx)
		cancel()
		if err != nil {
			return false // the join will say what is wrong
		}
		gw.checks, gw.bearer = cmp.Or(h.Attest, "none"), h.Bearer
	}
	return gw.checks == attest.By
}

// spent forgets the job credential after a join that carried it
// succeeded, or was refused because of it.
func (a *nodeAttest) spent(req control.JoinRequest, err error) {
	if a == nil || req.Attest == nil || req.Attest.MungeJob == "" {
		return
	}
	if err == nil || errors.Is(err, control.ErrAttestation) {
		a.jobCred = ""
	}
}
