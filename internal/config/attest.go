// SPDX-License-Identifier: MIT

package config

import (
	"math"
	"path/filepath"
)

// Attest is a config's attested identity ([attest]): whether and how the
// gateway checks the MUNGE credentials joins carry (internal/attest).
type Attest struct {
	// Set reports that the file has an [attest] table (which then takes
	// the place of the gateway's --attest flags).
	Set bool
	// Mode is AttestOff or AttestMunge.
	Mode string
	// Socket is the gateway's munged socket; "" means MUNGE's default.
	Socket string
	// Required refuses joins without a valid credential.
	Required bool
	// JobUIDs are the uids trusted to make job credentials; nil means
	// root only.
	JobUIDs []uint32
	// Origin is "match" ("" too) or "any".
	Origin string
}

// Attest modes.
const (
	AttestOff   = "off"
	AttestMunge = "munge"
)

type fileAttest struct {
	Mode     *string `toml:"mode"`
	Socket   string  `toml:"socket"`
	Required bool    `toml:"required"`
	JobUIDs  []int64 `toml:"job_uids"`
	Origin   string  `toml:"origin"`
}

// resolveAttest checks the [attest] table.
func (d *file) resolveAttest(bad func(string, string, ...any)) Attest {
	fa := d.Attest
	if fa == nil {
		return Attest{}
	}
	a := Attest{Set: true, Mode: AttestMunge, Socket: fa.Socket, Required: fa.Required, Origin: fa.Origin}
	if fa.Mode != nil {
		switch *fa.Mode {
		case AttestMunge, AttestOff:
			a.Mode = *fa.Mode
		default:
			bad("attest.mode", "%q: want \"munge\" or \"off\"", *fa.Mode)
		}
	}
	if a.Socket != "" && !filepath.IsAbs(a.Socket) {
		bad("attest.socket", "%q: want the absolute path of munged's socket", a.Socket)
	}
	switch a.Origin {
	case "", "match", "any":
	default:
		bad("attest.origin", "%q: want \"match\" (joins only from the credential's node) or \"any\"", a.Origin)
	}
	if fa.JobUIDs != nil {
		a.JobUIDs = []uint32{}
		for _, u := range fa.JobUIDs {
			if u < 0 || u >= math.MaxUint32 {
				bad("attest.job_uids", "%d: want uids (0 is root)", u)
				continue
			}
			a.JobUIDs = append(a.JobUIDs, uint32(u))
		}
	}
	if a.Mode == AttestOff && a.Required {
		bad("attest.required", "true with mode = \"off\": a gateway that checks no credential cannot require one")
	}
	return a
}
