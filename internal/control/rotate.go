// SPDX-License-Identifier: MIT

package control

// Key rotation without an outage.
//
// Clients pin the gateway's TLS public key, so a new key must reach every
// node before the gateway may depend on it, and a job that started with
// only the old pin must keep working until it ends. Both hold because the
// gateway serves two identities at once while a rotation is under way and
// picks, per TLS handshake, the one the client trusts:
//
//  1. `airlock gateway rotate-key` makes the next key (NextKeyFile,
//     NextCertFile) beside the current one; join.env then lists both pins
//     and the running gateway loads it.
//  2. The site hands the new join.env to its nodes. A client names the
//     pins it was given (AIRLOCK_PIN=sha256:NEW,sha256:OLD) in its TLS
//     ClientHello, as ALPN protocols "airlock-pin-<16 hex digits>" (the
//     first 8 bytes of each pin; pins are public), beside "http/1.1",
//     which the server selects. The server presents the next identity to
//     a client that names its pin, and the current one to every other
//     client: old clients, and clients that know only the old pin.
//  3. `airlock gateway rotate-key --finish`, once no node uses the old pin
//     (airlock_tls_handshakes_total{identity="current"} stops growing
//     while a rotation is under way), makes the next identity the only one.
//
// A pin hint only chooses which certificate the server sends; the client
// still checks the full pin, so a wrong hint costs a failed handshake, not
// trust.

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/airlock-vpn/airlock/internal/statefile"
)

// File names of the next TLS identity during a rotation.
const (
	NextKeyFile  = "tls-next.key"
	NextCertFile = "tls-next.crt"
)

// pinHintProto prefixes a pin hint in the ClientHello's ALPN list.
const pinHintProto = "airlock-pin-"

// pinHintLen is how many hex digits of a pin a hint carries.
const pinHintLen = 16

// maxPins bounds the pins one gateway may be given.
const maxPins = 8

// ParsePins parses one gateway's accepted pins: one pin, or several
// separated by "|" (or by "," when the caller knows they all belong to one
// gateway), each as [ParsePin] accepts it. It returns them canonical and
// without duplicates.
func ParsePins(s string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	for _, p := range strings.FieldsFunc(s, func(r rune) bool { return r == '|' || r == ',' }) {
		c, err := ParsePin(p)
		if err != nil {
			return nil, err
		}
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	if len(out) == 0 {
		_, err := ParsePin("")
		return nil, err
	}
	if len(out) > maxPins {
		return nil, fmt.Errorf("%d pins for one gateway: at most %d (during a key rotation two are enough)", len(out), maxPins)
	}
	return out, nil
}

// pinHint is the ALPN protocol that names pin in a ClientHello.
func pinHint(pin string) string {
	return pinHintProto + strings.TrimPrefix(pin, pinPrefix)[:pinHintLen]
}

// Identities is the set of TLS identities a gateway presents: the current
// one, and during a key rotation the next one. It is safe for concurrent
// use; Set replaces both while handshakes go on.
type Identities struct {
	ids atomic.Pointer[identitySet]
	// Handshakes counts the identities presented, "current" and "next".
	mu         sync.Mutex
	handshakes map[string]uint64
}

// identitySet is an immutable pair of identities.
type identitySet struct {
	current, next *tls.Certificate
	nextHint      string
}

// NewIdentities returns a set presenting current, and next to clients that
// name its pin (nil: no rotation under way).
func NewIdentities(current tls.Certificate, next *tls.Certificate) *Identities {
	ids := &Identities{handshakes: map[string]uint64{}}
	ids.Set(current, next)
	return ids
}

// Set replaces the identities.
func (ids *Identities) Set(current tls.Certificate, next *tls.Certificate) {
	s := &identitySet{current: &current, next: next}
	if next != nil {
		s.nextHint = pinHint(Fingerprint(next.Leaf))
	}
	ids.ids.Store(s)
}

// Pins returns the pins of the current identity and of the next one
// ("" when no rotation is under way).
func (ids *Identities) Pins() (current, next string) {
	s := ids.ids.Load()
	current = Fingerprint(s.current.Leaf)
	if s.next != nil {
		next = Fingerprint(s.next.Leaf)
	}
	return current, next
}

// Handshakes returns how many handshakes presented each identity.
func (ids *Identities) Handshakes() map[string]uint64 {
	ids.mu.Lock()
	defer ids.mu.Unlock()
	out := make(map[string]uint64, len(ids.handshakes))
	for k, v := range ids.handshakes {
		out[k] = v
	}
	return out
}

// GetCertificate is a tls.Config GetCertificate: the next identity for a
// client whose ClientHello names its pin, else the current one.
func (ids *Identities) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s := ids.ids.Load()
	cert, which := s.current, "current"
	if s.next != nil {
		for _, p := range hello.SupportedProtos {
			if p == s.nextHint {
				cert, which = s.next, "next"
				break
			}
		}
	}
	ids.mu.Lock()
	ids.handshakes[which]++
	ids.mu.Unlock()
	return cert, nil
}

// LoadNextIdentity returns the next identity in dir, or nil if no rotation
// is under way.
func LoadNextIdentity(dir string) (*tls.Certificate, error) {
	keyPath, certPath := filepath.Join(dir, NextKeyFile), filepath.Join(dir, NextCertFile)
	ok, err := statefile.Exists(keyPath)
	if err != nil || !ok {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certPath, keyPath)
	if err != nil {
		return nil, fmt.Errorf("load the next gateway identity (key rotation) from %s: %w", dir, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("parse %s: %w", certPath, err)
		}
	}
	return &cert, nil
}

// ErrRotation means a key rotation step does not fit the state directory:
// none under way for --finish, one under way already for a new one.
var ErrRotation = errors.New("key rotation")

// StartRotation makes the next identity in dir, with the names and
// addresses of the current certificate, and returns the current and next
// pins. It refuses if a rotation is under way or there is no current
// identity.
func StartRotation(dir string) (current, next string, err error) {
	cur, err := loadCurrent(dir)
	if err != nil {
		return "", "", err
	}
	if n, err := LoadNextIdentity(dir); err != nil || n != nil {
		if err != nil {
			return "", "", err
		}
		return "", "", fmt.Errorf("%w: one is under way already (next pin %s): finish it with --finish, or remove %s and %s to start again",
			ErrRotation, Fingerprint(n.Leaf), filepath.Join(dir, NextKeyFile), filepath.Join(dir, NextCertFile))
	}
	hosts := append([]string(nil), cur.Leaf.DNSNames...)
	for _, ip := range cur.Leaf.IPAddresses {
		hosts = append(hosts, ip.String())
	}
	cert, err := newIdentity(dir, NextKeyFile, NextCertFile, hosts)
	if err != nil {
		return "", "", err
	}
	return Fingerprint(cur.Leaf), Fingerprint(cert.Leaf), nil
}

// FinishRotation makes the next identity in dir the current one and
// returns its pin. Clients that know only the old pin fail from then on.
func FinishRotation(dir string) (string, error) {
	next, err := LoadNextIdentity(dir)
	if err != nil {
		return "", err
	}
	if next == nil {
		return "", fmt.Errorf("%w: none under way in %s: start one with airlock gateway rotate-key", ErrRotation, dir)
	}
	// Key first, as when the identity is made: a crash in between leaves
	// the new key with the old certificate, which the next start refuses
	// (tls: private key does not match public key) rather than serve.
	for _, mv := range [][2]string{{NextKeyFile, KeyFile}, {NextCertFile, CertFile}} {
		if err := os.Rename(filepath.Join(dir, mv[0]), filepath.Join(dir, mv[1])); err != nil {
			return "", fmt.Errorf("finish key rotation: %w", err)
		}
	}
	return Fingerprint(next.Leaf), nil
}

// loadCurrent loads dir's current identity, which must exist.
func loadCurrent(dir string) (*tls.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		return nil, fmt.Errorf("load the gateway identity from %s (has the gateway run with this --state?): %w", dir, err)
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
	}
	return &cert, nil
}

// pinSetString formats pins for an error message.
func pinSetString(pins []string) string { return strings.Join(pins, " or ") }
