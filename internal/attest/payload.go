// SPDX-License-Identifier: MIT

package attest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// The two payloads, as lines of KEY=VALUE after a first line that names
// the kind and version. They are parsed strictly: known keys only, each
// once, printable values within bounds, nothing after the last line.
const (
	// JoinMagic starts the payload of the credential the joining process
	// makes (airlock run, as the job's user).
	JoinMagic = "airlock-join/1"
	// JobMagic starts the payload of the credential root makes for a job
	// (the SPANK plugin in slurmstepd).
	JobMagic = "airlock-job/1"
	// maxPayload bounds either payload.
	maxPayload = 2048
	// maxValue bounds one value, but for the gateway's pins (maxPins of
	// them).
	maxValue = 256
	maxPins  = 8
)

// Pins returns the pins p names.
func (p JoinPayload) Pins() []string { return strings.Split(p.Gateway, ",") }

// JoinPayload is what the joining process's credential vouches for: that
// this uid, on this node, asks to join the gateway Gateway (its pin) with
// WireGuard key Key, and, if JobCred is set, that it holds the job
// credential whose SHA-256 it is.
type JoinPayload struct {
	// Gateway is the gateway's pin, sha256:HEX, or the pins the client
	// accepts for it separated by "," (during a key rotation).
	Gateway string
	Key     wgkey.Key // the join's WireGuard public key
	JobCred string    // hex SHA-256 of the job credential's text, or ""
}

// Marshal returns p's bytes.
func (p JoinPayload) Marshal() []byte {
	s := JoinMagic + "\ngateway=" + p.Gateway + "\nkey=" + p.Key.String() + "\n"
	if p.JobCred != "" {
		s += "job=" + p.JobCred + "\n"
	}
	return []byte(s)
}

// JobCredHash is the JobCred of a join that carries the job credential
// cred.
func JobCredHash(cred string) string {
	h := sha256.Sum256([]byte(cred))
	return hex.EncodeToString(h[:])
}

// ParseJoinPayload parses a join credential's payload.
func ParseJoinPayload(b []byte) (JoinPayload, error) {
	kv, err := parseLines(b, JoinMagic, "gateway", "key", "job")
	if err != nil {
		return JoinPayload{}, err
	}
	var p JoinPayload
	p.Gateway = kv["gateway"]
	pins := strings.Split(p.Gateway, ",")
	if len(pins) > maxPins {
		return JoinPayload{}, fmt.Errorf("gateway=: %d pins, at most %d", len(pins), maxPins)
	}
	for _, pin := range pins {
		if !strings.HasPrefix(pin, "sha256:") || len(pin) != len("sha256:")+64 || !isHex(pin[7:]) {
			return JoinPayload{}, fmt.Errorf("gateway=%q: want sha256: and 64 hex digits (the gateway's pin), or several separated by commas", truncate(p.Gateway))
		}
	}
	if p.Key, err = wgkey.Parse(kv["key"]); err != nil || p.Key.IsZero() {
		return JoinPayload{}, fmt.Errorf("key=%q: want a WireGuard public key", kv["key"])
	}
	if j, ok := kv["job"]; ok {
		if len(j) != 64 || !isHex(j) {
			return JoinPayload{}, fmt.Errorf("job=%q: want the job credential's SHA-256 in hex", j)
		}
		p.JobCred = j
	}
	return p, nil
}

// JobPayload is what root's credential vouches for: that the batch
// system's job JobID (step Step) of user UID (group GID) runs on node
// Node.
type JobPayload struct {
	Batch string // the batch system: "slurm"
	JobID string
	Step  string // the step: a number, "batch" or "extern"; may be ""
	UID   uint32
	GID   uint32
	Node  string // the batch system's name for the node
}

// Marshal returns p's bytes (the SPANK plugin writes the same in C).
func (p JobPayload) Marshal() []byte {
	s := fmt.Sprintf("%s\nbatch=%s\njob=%s\n", JobMagic, p.Batch, p.JobID)
	if p.Step != "" {
		s += "step=" + p.Step + "\n"
	}
	s += fmt.Sprintf("uid=%d\ngid=%d\n", p.UID, p.GID)
	if p.Node != "" {
		s += "node=" + p.Node + "\n"
	}
	return []byte(s)
}

// ParseJobPayload parses a job credential's payload.
func ParseJobPayload(b []byte) (JobPayload, error) {
	kv, err := parseLines(b, JobMagic, "batch", "job", "step", "uid", "gid", "node")
	if err != nil {
		return JobPayload{}, err
	}
	p := JobPayload{Batch: kv["batch"], JobID: kv["job"], Step: kv["step"], Node: kv["node"]}
	if p.Batch == "" || p.JobID == "" {
		return JobPayload{}, errors.New("batch= and job= are required")
	}
	for _, f := range []struct {
		name string
		dst  *uint32
	}{{"uid", &p.UID}, {"gid", &p.GID}} {
		v, ok := kv[f.name]
		if !ok {
			return JobPayload{}, fmt.Errorf("%s= is required", f.name)
		}
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil || n == 0xffffffff || v != strconv.FormatUint(n, 10) {
			return JobPayload{}, fmt.Errorf("%s=%q: want a decimal id", f.name, v)
		}
		*f.dst = uint32(n)
	}
	return p, nil
}

// parseLines parses magic's KEY=VALUE lines with only the keys allowed.
func parseLines(b []byte, magic string, allowed ...string) (map[string]string, error) {
	if len(b) > maxPayload {
		return nil, fmt.Errorf("payload of %d bytes, more than %d", len(b), maxPayload)
	}
	s := string(b)
	if !utf8.ValidString(s) {
		return nil, errors.New("payload is not UTF-8")
	}
	lines := strings.Split(s, "\n")
	if len(lines) < 2 || lines[len(lines)-1] != "" {
		return nil, errors.New("payload does not end with a newline")
	}
	lines = lines[:len(lines)-1]
	if lines[0] != magic {
		return nil, fmt.Errorf("payload starts %q, want %q", truncate(lines[0]), magic)
	}
	kv := map[string]string{}
	for i, line := range lines[1:] {
		k, v, ok := strings.Cut(line, "=")
		known := false
		for _, a := range allowed {
			known = known || a == k
		}
		switch {
		case !ok:
			return nil, fmt.Errorf("payload line %d: want KEY=VALUE", i+2)
		case !known:
			return nil, fmt.Errorf("payload line %d: unknown key %q", i+2, truncate(k))
		case kv[k] != "" || hasKey(kv, k):
			return nil, fmt.Errorf("payload line %d: %s= twice", i+2, k)
		case v == "" || (len(v) > maxValue && k != "gateway") || len(v) > maxPins*72 || !printable(v):
			return nil, fmt.Errorf("payload line %d: %s= wants 1 to %d printable characters", i+2, k, maxValue)
		}
		kv[k] = v
	}
	return kv, nil
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

// printable reports whether s has only printable ASCII without spaces.
func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] >= 0x7f {
			return false
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
