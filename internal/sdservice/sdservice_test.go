// SPDX-License-Identifier: MIT

package sdservice

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func noTime(groups []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey && len(groups) == 0 {
		return slog.Attr{}
	}
	return a
}

// TestPriorityPrefix checks the exact bytes journald reads: one <N> per
// record, N by level, before the text handler's line, with attributes and
// groups kept.
func TestPriorityPrefix(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(PriorityHandler(&b, func(w io.Writer) slog.Handler {
		return slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug, ReplaceAttr: noTime})
	})).With("gw", "a")
	log.Debug("per flow", "n", 1)
	log.Info("gateway ready")
	log.Warn("degraded", "why", "x y")
	log.WithGroup("g").Error("failed", "err", "boom")
	log.Log(nil, slog.LevelError+4, "worse")
	want := "<7>level=DEBUG msg=\"per flow\" gw=a n=1\n" +
		"<6>level=INFO msg=\"gateway ready\" gw=a\n" +
		"<4>level=WARN msg=degraded gw=a why=\"x y\"\n" +
		"<3>level=ERROR msg=failed gw=a g.err=boom\n" +
		"<3>level=ERROR+4 msg=worse gw=a\n"
	if got := b.String(); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}

// TestPriorityLevelFilter: the inner handlers' level still decides.
func TestPriorityLevelFilter(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(PriorityHandler(&b, func(w io.Writer) slog.Handler {
		return slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn, ReplaceAttr: noTime})
	}))
	log.Info("hidden")
	log.Warn("shown")
	if got, want := b.String(), `<4>{"level":"WARN","msg":"shown"}`+"\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestOnJournal: JOURNAL_STREAM names the stream by device and inode; a
// file that is not it (a child's redirected stderr) is not on the journal.
func TestOnJournal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stream"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	other, err := os.Create(filepath.Join(t.TempDir(), "other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "JOURNAL_STREAM" {
				return v
			}
			return ""
		}
	}
	stream := fmtStream(uint64(st.Dev), st.Ino)
	for _, c := range []struct {
		f    *os.File
		env  string
		want bool
	}{
		{f, stream, true},
		{other, stream, false},
		{f, "", false},
		{f, "junk", false},
		{f, fmtStream(uint64(st.Dev), st.Ino+1), false},
	} {
		if got := OnJournal(c.f, env(c.env)); got != c.want {
			t.Errorf("OnJournal(%s, JOURNAL_STREAM=%q) = %v, want %v", c.f.Name(), c.env, got, c.want)
		}
	}
}

func fmtStream(dev, ino uint64) string {
	return strconv.FormatUint(dev, 10) + ":" + strconv.FormatUint(ino, 10)
}

// TestNotify receives what a Notifier sends on a unixgram socket, as
// systemd's $NOTIFY_SOCKET, both as a path and as an abstract name.
func TestNotify(t *testing.T) {
	path := filepath.Join(t.TempDir(), "notify")
	for _, name := range []string{path, "@airlock-sdservice-test-" + strconv.Itoa(os.Getpid())} {
		l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
		if err != nil {
			t.Fatal(err)
		}
		n, err := NewNotifier(func(k string) string {
			if k == "NOTIFY_SOCKET" {
				return name
			}
			return ""
		})
		if err != nil || !n.Enabled() {
			t.Fatalf("NewNotifier(%q): %v %v", name, n, err)
		}
		recv := func() string {
			buf := make([]byte, 4096)
			_ = l.SetReadDeadline(time.Now().Add(5 * time.Second))
			k, err := l.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			return string(buf[:k])
		}
		if err := n.Ready("2 jobs"); err != nil {
			t.Fatal(err)
		}
		if got, want := recv(), "READY=1\nSTATUS=2 jobs"; got != want {
			t.Errorf("Ready: got %q, want %q", got, want)
		}
		if err := n.Reloading(); err != nil {
			t.Fatal(err)
		}
		if got := recv(); !strings.HasPrefix(got, "RELOADING=1\nMONOTONIC_USEC=") || len(got) < len("RELOADING=1\nMONOTONIC_USEC=1") {
			t.Errorf("Reloading: got %q", got)
		}
		if err := n.Stopping(); err != nil {
			t.Fatal(err)
		}
		if got, want := recv(), "STOPPING=1"; got != want {
			t.Errorf("Stopping: got %q, want %q", got, want)
		}
		l.Close()
	}
	// Without NOTIFY_SOCKET: nothing, no error.
	n, err := NewNotifier(func(string) string { return "" })
	if err != nil || n.Enabled() || n.Ready("") != nil {
		t.Errorf("without NOTIFY_SOCKET: %v %v", n, err)
	}
	if _, err := NewNotifier(func(string) string { return "vsock:2:123" }); err == nil {
		t.Error("NOTIFY_SOCKET=vsock:2:123: no error")
	}
}
