// SPDX-License-Identifier: MIT

package client

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"github.com/airlock-vpn/airlock/internal/control"
)

// EgressFileEnv names the file, in the job's environment, that always
// holds the job's current egress: AIRLOCK_EGRESS_ADDR, AIRLOCK_EGRESS_PORTS
// and AIRLOCK_GATEWAY lines (KEY=VALUE, shell-sourceable). The variables of
// the job's environment are fixed when it starts; after a failover to
// another gateway the file names the new one (rewritten whole, by rename,
// so a reader never sees half of it). It lives in a private directory
// (0700) that airlock run removes at exit.
const EgressFileEnv = "AIRLOCK_EGRESS_FILE"

// writeEgressFile (re)writes the session's egress file for its current
// lease, creating its directory at the first call; nothing unless the
// session was asked for one (SessionConfig.EgressFile).
func (s *Session) writeEgressFile() {
	if !s.egressOn {
		return
	}
	if s.egressDir == "" {
		dir, err := os.MkdirTemp("", "airlock-egress-")
		if err != nil {
			s.log.Warn("no egress file for the job", "err", err)
			return
		}
		s.egressDir = dir
	}
	var b strings.Builder
	ls := s.lease
	if ls.Ports[0] > 0 && ls.Ports[1] >= ls.Ports[0] {
		if a := publicAddr4(ls); a.IsValid() {
			fmt.Fprintf(&b, "%s=%s\n", EgressAddrEnv, a)
		}
		fmt.Fprintf(&b, "%s=%d-%d\n", EgressPortsEnv, ls.Ports[0], ls.Ports[1])
	}
	if s.cur != nil {
		fmt.Fprintf(&b, "AIRLOCK_GATEWAY=%s\n", s.cur.addr)
	}
	if err := replaceFile(s.egressFile(), []byte(b.String()), 0o644); err != nil {
		s.log.Warn("cannot write the job's egress file", "err", err)
	}
}

// replaceFile replaces path with data by a rename, so that a reader sees
// the old or the new file whole. Unlike statefile.WriteAtomic it does not
// sync: the file lives as long as the job, and an fsync on the job's
// start path costs milliseconds (more on a busy node's disk).
func replaceFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// egressFile is the egress file's path, "" before the first write.
func (s *Session) egressFile() string {
	if s.egressDir == "" {
		return ""
	}
	return filepath.Join(s.egressDir, "egress.env")
}

// removeEgressFile removes the egress file's directory.
func (s *Session) removeEgressFile() {
	if s.egressDir != "" {
		os.RemoveAll(s.egressDir)
	}
}

// publicAddr4 is the lease's IPv4 egress address, the one its port block
// is on; zero without one.
func publicAddr4(ls control.Lease) netip.Addr {
	for _, a := range ls.PublicAddrs {
		if a.Is4() {
			return a
		}
	}
	return netip.Addr{}
}
