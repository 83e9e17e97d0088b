// SPDX-License-Identifier: MIT

package tunnel

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// SocketBufferSize is what wireguard-go's UDP bind asks for as each
// socket's receive and send buffer (conn's socketBufferSize). Without
// CAP_NET_ADMIN the kernel grants at most net.core.rmem_max and
// net.core.wmem_max (208 KiB by default): at 3 Gbit/s that holds about half
// a millisecond of packets, and a burst beyond it is dropped.
const SocketBufferSize = 7 << 20

// SocketStats describes this process's UDP sockets on one port: the
// WireGuard bind's.
type SocketStats struct {
	// Sockets is how many were found (one per address family).
	Sockets int
	// RcvBuf and SndBuf are the smallest receive and send buffers the
	// kernel granted (getsockopt, which reports twice the bytes asked
	// for: the kernel's bookkeeping overhead included), 0 if unknown.
	RcvBuf, SndBuf int
	// Drops counts datagrams the kernel dropped at these sockets, mostly
	// because the receive buffer was full: the counter SO_RXQ_OVFL
	// reports, read from /proc/self/net/udp{,6} without a change to
	// wireguard-go's receive path.
	Drops uint64
}

// SocketWatch reads the stats of the UDP sockets of this process bound to
// one port. It is safe for concurrent use; make it with NewSocketWatch.
type SocketWatch struct {
	port uint16

	mu      sync.Mutex
	inodes  map[uint64]bool // guarded by mu: the sockets' inodes
	buffers SocketStats     // guarded by mu: RcvBuf, SndBuf, Sockets
}

// NewSocketWatch returns a watch of port's UDP sockets; it finds them
// (a scan of the process's descriptors) on the first Stats.
func NewSocketWatch(port uint16) *SocketWatch { return &SocketWatch{port: port} }

// Stats returns the sockets' buffers and drops.
func (w *SocketWatch) Stats() (SocketStats, error) {
	rows, err := udpRows(w.port)
	if err != nil {
		return SocketStats{}, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.inodes == nil || !anyOf(rows, w.inodes) {
		if err := w.findLocked(rows); err != nil {
			return SocketStats{}, err
		}
	}
	st := w.buffers
	for ino, drops := range rows {
		if w.inodes[ino] {
			st.Drops += drops
		}
	}
	return st, nil
}

func anyOf(rows map[uint64]uint64, inodes map[uint64]bool) bool {
	for ino := range rows {
		if inodes[ino] {
			return true
		}
	}
	return false
}

// findLocked finds the descriptors of the sockets in rows among the
// process's and reads their buffer sizes.
func (w *SocketWatch) findLocked(rows map[uint64]uint64) error {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return fmt.Errorf("udp socket stats: %w", err)
	}
	w.inodes = map[uint64]bool{}
	w.buffers = SocketStats{}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
		if err != nil || !strings.HasPrefix(l, "socket:[") {
			continue
		}
		ino, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]"), 10, 64)
		if _, ok := rows[ino]; err != nil || !ok {
			continue
		}
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		rcv, err1 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF)
		snd, err2 := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUF)
		if err1 != nil || err2 != nil {
			continue // closed meanwhile
		}
		w.inodes[ino] = true
		b := &w.buffers
		b.Sockets++
		if b.RcvBuf == 0 || rcv < b.RcvBuf {
			b.RcvBuf = rcv
		}
		if b.SndBuf == 0 || snd < b.SndBuf {
			b.SndBuf = snd
		}
	}
	return nil
}

// udpRows returns inode → drops of the UDP sockets bound to port in this
// process's network namespace (/proc/self/net/udp and udp6).
func udpRows(port uint16) (map[uint64]uint64, error) {
	rows := map[uint64]uint64{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/self/net/udp", "/proc/self/net/udp6"} {
		fh, err := os.Open(f)
		if err != nil {
			if os.IsNotExist(err) {
				continue // no IPv6
			}
			return nil, fmt.Errorf("udp socket stats: %w", err)
		}
		sc := bufio.NewScanner(fh)
		sc.Scan() // header
		for sc.Scan() {
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref ptr drops
			fs := strings.Fields(sc.Text())
			if len(fs) < 13 || !strings.HasSuffix(fs[1], want) {
				continue
			}
			ino, err1 := strconv.ParseUint(fs[9], 10, 64)
			drops, err2 := strconv.ParseUint(fs[12], 10, 64)
			if err1 == nil && err2 == nil {
				rows[ino] = drops
			}
		}
		fh.Close()
	}
	return rows, nil
}
