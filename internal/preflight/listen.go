// SPDX-License-Identifier: MIT

package preflight

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listen checks that the gateway's ADDR:PORT can be bound for TCP (the
// control API) and UDP (WireGuard), then frees it again.
func Listen(addr string) Result {
	r := Result{Name: "listen " + addr, Status: Problem}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		r.Detail = fmt.Sprintf("TCP: %v", err)
		r.Fix = "choose a free --listen address and port (another gateway or program has this one), or an address of this host"
		return r
	}
	l.Close()
	u, err := net.ListenPacket("udp", addr)
	if err != nil {
		r.Detail = fmt.Sprintf("UDP: %v", err)
		r.Fix = "choose a free --listen port for UDP too (WireGuard uses the same port number)"
		return r
	}
	u.Close()
	return Result{Name: r.Name, Status: OK, Detail: "TCP and UDP can be bound"}
}

// StateDir checks that dir is the gateway user's 0700 directory, or can be
// created.
func (h *Host) StateDir(dir string) Result {
	r := Result{Name: "state directory " + dir, Status: Problem}
	if dir == "" {
		r.Detail, r.Fix = "not given", "give --state DIR"
		return r
	}
	fi, err := os.Stat(dir)
	if os.IsNotExist(err) {
		parent := filepath.Dir(dir)
		if err := unix.Access(parent, unix.W_OK|unix.X_OK); err != nil {
			r.Detail = fmt.Sprintf("missing, and %s is not writable: %v", parent, err)
			r.Fix = fmt.Sprintf("create it for the gateway's user: install -d -m 0700 -o USER %s", dir)
			return r
		}
		return Result{Name: r.Name, Status: OK, Detail: "missing; the first start creates it (0700) with a new identity"}
	}
	if err != nil {
		r.Detail = err.Error()
		return r
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		r.Detail, r.Fix = "not a directory", "point --state at a directory"
	case st != nil && h.UID == 0 && st.Uid != 0:
		// The usual slip: the packaged service runs as its own user, and
		// root's view of namespaces, the device and limits is not its.
		who := strconv.FormatUint(uint64(st.Uid), 10)
		if u, err := user.LookupId(who); err == nil {
			who = u.Username
		}
		r.Detail = fmt.Sprintf("owned by %s, and this check runs as root: the gateway runs as %s, and what root may do says nothing about it", who, who)
		r.Fix = fmt.Sprintf("run the check as that user: sudo -u %s airlock gateway --check --state %s (the packaged service's settings: add --env-file /etc/default/airlock-gateway, or /etc/sysconfig/airlock-gateway)", who, dir)
	case st != nil && int(st.Uid) != h.UID:
		r.Detail = fmt.Sprintf("owned by uid %d, not the gateway's uid %d", st.Uid, h.UID)
		r.Fix = fmt.Sprintf("chown -R %d %s (the gateway keeps its keys there)", h.UID, dir)
	case fi.Mode().Perm() != 0o700:
		r.Status = Warn
		r.Detail = fmt.Sprintf("mode %04o: others could read the gateway's keys; the gateway sets 0700 when it starts", fi.Mode().Perm())
		r.Fix = "chmod 0700 " + dir
	default:
		_, err := os.Stat(filepath.Join(dir, "join.env"))
		d := "0700, the gateway's"
		if err == nil {
			d += "; has an identity (join.env)"
		}
		return Result{Name: r.Name, Status: OK, Detail: d}
	}
	return r
}
