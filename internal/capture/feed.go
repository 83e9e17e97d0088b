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
// one and starts a new stream. A file is created 0600 (an existing one is
// truncated); a write error to it ends the feed with an Error log. It
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
// without a reader gives ENXIO. A new file is created 0600; symbolic
// links are not followed.
func openPath(path string) (f *os.File, fifo bool, err error) {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
		return f, false, err
	case err != nil:
		return nil, false, err
	case fi.Mode()&os.ModeNamedPipe != 0:
		// Non-blocking: the open fails at once without a reader, and
		// writes wait in Go's poller, so Close interrupts them.
		f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		return f, true, err
	case fi.Mode()&os.ModeSymlink != 0:
		return nil, false, fmt.Errorf("%s is a symbolic link: name its target", path)
	case fi.Mode()&os.ModeCharDevice != 0:
		f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_CLOEXEC, 0)
		return f, false, err
	case fi.Mode().IsRegular():
		f, err = os.OpenFile(path, os.O_WRONLY|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		return f, false, err
	}
	return nil, false, fmt.Errorf("%s is neither a file, a named pipe nor a character device", path)
}

// CreateFile creates (or truncates) a capture file for an admin's live
// capture: mode 0600 when new, symbolic links not followed.
func CreateFile(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
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
