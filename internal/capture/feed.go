// SPDX-License-Identifier: MIT

package capture

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// TAPPrefix marks a feed's destination as a TAP device: "tap:NAME".
const TAPPrefix = "tap:"

// FeedConfig is a standing capture: a tap and where its stream goes.
type FeedConfig struct {
	TapConfig
	// To is a file or named pipe path, or TAPPrefix+NAME for an existing
	// TAP device (one Ethernet frame per packet; the device must belong
	// to the gateway's user or the gateway must have CAP_NET_ADMIN).
	To string
}

// ValidateTo checks a feed's destination without opening it.
func ValidateTo(to string) error {
	if name, ok := strings.CutPrefix(to, TAPPrefix); ok {
		if name == "" || len(name) >= 16 || strings.ContainsAny(name, "/ \t\n:") {
			return fmt.Errorf("%q: want tap:NAME with an interface name of 1-15 characters", to)
		}
		return nil
	}
	if !filepath.IsAbs(to) {
		return fmt.Errorf("%q: want an absolute path (a file or a named pipe) or tap:NAME", to)
	}
	return nil
}

// fifoPoll is how often a feed to a named pipe looks for a reader.
const fifoPoll = 200 * time.Millisecond

// RunFeed runs a standing capture on d until ctx ends: it opens cfg.To,
// attaches a tap and streams into it. A named pipe is captured only while
// a reader has it open; when the reader goes, the feed waits for the next
// one and starts a new stream. A file is created 0600 (an existing one of
// the gateway's own, not open to other users, is truncated; openPath says
// what is refused); a write error to it ends the feed with an Error log. It
// returns when ctx ends.
func RunFeed(ctx context.Context, log *slog.Logger, d *Device, cfg FeedConfig) {
	if name, ok := strings.CutPrefix(cfg.To, TAPPrefix); ok {
		cfg.Link = LinkEthernet
		t := d.NewTap(cfg.TapConfig)
		w, err := openTAP(name)
		if err != nil {
			log.Error("capture feed: cannot open the TAP device; the feed is off", "feed", cfg.Name, "to", cfg.To, "err", err)
			return
		}
		defer w.Close()
		stop := context.AfterFunc(ctx, func() { w.Close() })
		defer stop()
		d.Attach(t)
		defer d.Detach(t)
		log.Info("capture feed writing", "feed", cfg.Name, "to", cfg.To, "filter", cfg.Filter.String())
		if err := t.Serve(ctx, w, nil); err != nil && ctx.Err() == nil {
			log.Error("capture feed: writing to the TAP device failed; the feed is off", "feed", cfg.Name, "to", cfg.To, "err", err)
		}
		return
	}
	t := d.NewTap(cfg.TapConfig)
	waiting := false
	for ctx.Err() == nil {
		f, fifo, err := openPath(cfg.To)
		if errors.Is(err, syscall.ENXIO) { // a named pipe without a reader
			if !waiting {
				log.Info("capture feed waiting for a reader of the named pipe", "feed", cfg.Name, "to", cfg.To)
				waiting = true
			}
			select {
			case <-ctx.Done():
			case <-time.After(fifoPoll):
			}
			continue
		}
		if err != nil {
			log.Error("capture feed: cannot open its destination; the feed is off", "feed", cfg.Name, "to", cfg.To, "err", err)
			return
		}
		waiting = false
		stop := context.AfterFunc(ctx, func() { f.Close() })
		d.Attach(t)
		log.Info("capture feed writing", "feed", cfg.Name, "to", cfg.To, "filter", cfg.Filter.String())
		err = t.Serve(ctx, f, nil)
		d.Detach(t)
		stop()
		f.Close()
		switch {
		case ctx.Err() != nil:
			return
		case fifo && errors.Is(err, syscall.EPIPE):
			log.Info("capture feed: the named pipe's reader went away", "feed", cfg.Name, "to", cfg.To)
		default:
			log.Error("capture feed: writing failed; the feed is off", "feed", cfg.Name, "to", cfg.To, "err", err)
			return
		}
	}
}

// openPath opens a feed's file or named pipe for writing. A named pipe
// without a reader gives ENXIO. A new file is created 0600. What exists
// must be safe to hand jobs' traffic to (checkTarget, on the opened
// descriptor, so that nothing can be swapped in between): symbolic links
// are not followed, and a file or pipe another user owns, or that anyone
// may read or write, is refused. An existing file of the gateway's own is
// truncated once it has passed.
func openPath(path string) (f *os.File, fifo bool, err error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		return f, false, err
	case err != nil:
		return nil, false, err
	case fi.Mode()&os.ModeSymlink != 0:
		return nil, false, fmt.Errorf("%s is a symbolic link: name its target", path)
	}
	fifo = fi.Mode()&os.ModeNamedPipe != 0
	// Non-blocking: a named pipe's open fails at once without a reader
	// (and a file swapped for a pipe cannot hang the open); writes wait in
	// Go's poller, so Close interrupts them.
	f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fifo, err
	}
	regular, err := checkTarget(f)
	if err == nil && regular {
		err = f.Truncate(0)
	}
	if err != nil {
		f.Close()
		return nil, fifo, fmt.Errorf("%s: %w", path, err)
	}
	return f, fifo, nil
}

// checkTarget checks an opened feed destination: a regular file or named
// pipe owned by the gateway's user that nobody else may read or write
// (group access is the owner's choice, e.g. for an IDS account), or a
// character device owned by that user or root. It reports whether f is a
// regular file.
func checkTarget(f *os.File) (regular bool, err error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return false, err
	}
	me := uint32(os.Geteuid())
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG, syscall.S_IFIFO:
		if st.Uid != me {
			return false, fmt.Errorf("owned by uid %d, not the gateway's (uid %d): refusing to write jobs' traffic where another user put it; remove it, or make it as the gateway's user", st.Uid, me)
		}
		if st.Mode&0o007 != 0 {
			return false, fmt.Errorf("mode %04o lets any user of the host at jobs' traffic: refusing it; chmod o-rwx it (e.g. mkfifo -m 600)", st.Mode&0o7777)
		}
		return st.Mode&syscall.S_IFMT == syscall.S_IFREG, nil
	case syscall.S_IFCHR:
		if st.Uid != me && st.Uid != 0 {
			return false, fmt.Errorf("a device owned by uid %d, neither the gateway's (uid %d) nor root's: refusing it", st.Uid, me)
		}
		return false, nil
	}
	return false, errors.New("neither a file, a named pipe nor a character device")
}

// CheckNewFile reports, before a live capture starts, why CreateFile of
// path would fail: path exists, or its directory does not.
func CheckNewFile(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("%s exists: name a new file (airlock capture never writes into an existing one)", path)
	}
	if fi, err := os.Stat(filepath.Dir(path)); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	} else if !fi.IsDir() {
		return fmt.Errorf("%s: %s is not a directory", path, filepath.Dir(path))
	}
	return nil
}

// CreateFile creates a capture file for an admin's live capture (airlock
// capture -w): mode 0600, symbolic links not followed, and never an
// existing file, which is neither truncated nor written.
func CreateFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("%s exists: name a new file (airlock capture never writes into an existing one)", path)
	}
	return f, err
}

// tapWriter turns a pcap stream of Ethernet records into one write per
// frame on a TAP device. Frames the device refuses (down, say) are
// dropped, not errors.
type tapWriter struct {
	f *os.File
	// pending holds a partial header or record across Writes; skip is
	// what is left of the global header.
	pending []byte
	skip    int
	dropped uint64
}

func (w *tapWriter) Write(p []byte) (int, error) {
	n := len(p)
	if w.skip > 0 {
		k := min(w.skip, len(p))
		w.skip -= k
		p = p[k:]
	}
	for len(p) > 0 {
		if len(w.pending) < recordHeaderLen {
			k := min(recordHeaderLen-len(w.pending), len(p))
			w.pending = append(w.pending, p[:k]...)
			p = p[k:]
			continue
		}
		capLen := int(uint32(w.pending[8]) | uint32(w.pending[9])<<8 | uint32(w.pending[10])<<16 | uint32(w.pending[11])<<24)
		need := recordHeaderLen + capLen - len(w.pending)
		k := min(need, len(p))
		w.pending = append(w.pending, p[:k]...)
		p = p[k:]
		if k == need {
			if _, err := w.f.Write(w.pending[recordHeaderLen:]); err != nil {
				if errors.Is(err, os.ErrClosed) {
					return 0, err
				}
				w.dropped++
			}
			w.pending = w.pending[:0]
		}
	}
	return n, nil
}

func (w *tapWriter) Close() error { return w.f.Close() }

var _ io.WriteCloser = (*tapWriter)(nil)
