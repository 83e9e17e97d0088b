// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"
	"path/filepath"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
)

// Pins is join.env's AIRLOCK_PIN: the current pin, or during a key
// rotation the next and the current one (a client accepts either).
func (i Info) Pins() string {
	if i.NextFingerprint == "" {
		return i.Fingerprint
	}
	return i.NextFingerprint + "," + i.Fingerprint
}

// RotateKey implements admin.KeyRotator: it starts or finishes a rotation
// of the control API's TLS key in the state directory (control/rotate.go),
// puts it in force for new handshakes at once, and rewrites join.env.
// Running jobs keep their connections.
func (ag *adminGateway) RotateKey(finish bool) (admin.RotateKeyResult, error) {
	ag.rotateMu.Lock()
	defer ag.rotateMu.Unlock()
	dir := ag.g.cfg.StateDir
	if finish {
		if _, err := control.FinishRotation(dir); err != nil {
			return admin.RotateKeyResult{}, err
		}
	} else if _, _, err := control.StartRotation(dir); err != nil {
		return admin.RotateKeyResult{}, err
	}
	cur, fp, _, err := control.LoadOrCreateIdentity(dir, nil)
	if err != nil {
		return admin.RotateKeyResult{}, err
	}
	next, err := control.LoadNextIdentity(dir)
	if err != nil {
		return admin.RotateKeyResult{}, err
	}
	ag.g.res.ids.Set(cur, next)
	info := ag.g.res.info
	info.Fingerprint, info.NextFingerprint = fp, ""
	if next != nil {
		info.NextFingerprint = control.Fingerprint(next.Leaf)
	}
	ag.g.res.info = info
	if err := writeJoinEnv(filepath.Join(dir, JoinEnvFile), info); err != nil {
		return admin.RotateKeyResult{}, fmt.Errorf("rewrite join.env: %w", err)
	}
	ag.g.log.Warn("TLS key rotation", "finish", finish, "AIRLOCK_PIN", info.Pins())
	return admin.RotateKeyResult{Pin: info.Pins(), Current: fp, Next: info.NextFingerprint, Handshakes: ag.g.res.ids.Handshakes()}, nil
}

// registerTLSMetrics registers airlock_tls_handshakes_total.
func (ag *adminGateway) registerTLSMetrics(reg prometheus.Registerer) error {
	for _, which := range []string{"current", "next"} {
		c := prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "airlock_tls_handshakes_total",
			Help:        "Control API TLS handshakes by the identity presented: current, or next during a key rotation (to clients that name its pin).",
			ConstLabels: prometheus.Labels{"identity": which},
		}, func() float64 { return float64(ag.g.res.ids.Handshakes()[which]) })
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
