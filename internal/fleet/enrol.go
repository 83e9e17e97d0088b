// SPDX-License-Identifier: MIT

package fleet

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/airlock-vpn/airlock/internal/store"
)

// Enrolment: which members of the database's member table clients may
// fail over to. The table is shared state that every gateway's database
// role writes (its own row), so a row is not proof of a gateway: anyone
// with a gateway's database password could add one that names a host of
// theirs, with a large free capacity. The site therefore holds a fleet key
// (an Ed25519 key, FILE of --fleet-key, made by airlock db fleet-key) on
// its gateways only, never in the database; each gateway signs its member
// record (ID, Advertise, Pin) at each heartbeat, and a gateway hands its
// clients only the members whose signature holds. A client trusts its
// gateway (pinned TLS), and so follows only members the site enrolled.
// Without a fleet key a gateway tells its clients of no other member.

// KeyFileMode is the most a fleet key file may allow.
const KeyFileMode = 0o600

// ErrNotEnrolled means a member record's signature does not hold.
var ErrNotEnrolled = errors.New("member not enrolled by the fleet key")

// NewKeyFile writes a new fleet key to path (mode 0600), refusing to
// overwrite one.
func NewKeyFile(path string) error {
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, KeyFileMode)
	if err != nil {
		return fmt.Errorf("fleet key: %w", err)
	}
	if _, err := fmt.Fprintln(f, base64.StdEncoding.EncodeToString(seed)); err != nil {
		f.Close()
		return fmt.Errorf("fleet key: %w", err)
	}
	return f.Close()
}

// LoadKey reads the fleet key of path, refusing a file that others may
// read.
func LoadKey(path string) (ed25519.PrivateKey, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("fleet key: %w (make one with airlock db fleet-key FILE and copy it to every gateway)", err)
	}
	if fi.Mode().Perm()&^KeyFileMode != 0 {
		return nil, fmt.Errorf("fleet key %s has mode %04o: others may read it; chmod 600 %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("fleet key: %w", err)
	}
	seed, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("fleet key %s: not a key made by airlock db fleet-key (one line, base64 of %d bytes)", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// memberMessage is what a member's signature covers.
func memberMessage(m store.Member) []byte {
	return []byte("airlock fleet member v1\x00" + m.ID + "\x00" + m.Advertise + "\x00" + m.Pin)
}

// SignMember returns m with its Sig made by key.
func SignMember(key ed25519.PrivateKey, m store.Member) store.Member {
	m.Sig = base64.StdEncoding.EncodeToString(ed25519.Sign(key, memberMessage(m)))
	return m
}

// VerifyMember returns nil if m's Sig is pub's signature of it.
func VerifyMember(pub ed25519.PublicKey, m store.Member) error {
	sig, err := base64.StdEncoding.DecodeString(m.Sig)
	if err != nil || m.Sig == "" || !ed25519.Verify(pub, memberMessage(m), sig) {
		return fmt.Errorf("%w: member %q at %q", ErrNotEnrolled, store.Truncate(m.ID), store.Truncate(m.Advertise))
	}
	return nil
}
