// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"

	"github.com/airlock-vpn/airlock/internal/sdservice"
)

// Log formats of --log-format.
const (
	logFormatText = "text"
	logFormatJSON = "json"
)

// newLoggerFormat returns a logger on w at the named level, in format
// text (logfmt-like key=value) or json (one object per line with time,
// level, msg and the record's attributes), for a site's log shipper.
// When w is the journal stream systemd gave the service (JOURNAL_STREAM),
// every line starts with its syslog priority, <3> for errors to <7> for
// debug, which journald stores as the entry's priority (journalctl -p
// warning).
func newLoggerFormat(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	var mk func(io.Writer) slog.Handler
	switch format {
	case logFormatText, "":
		mk = func(w io.Writer) slog.Handler { return slog.NewTextHandler(w, opts) }
	case logFormatJSON:
		mk = func(w io.Writer) slog.Handler { return slog.NewJSONHandler(w, opts) }
	default:
		return nil, fmt.Errorf("bad --log-format %q: want %s or %s", format, logFormatText, logFormatJSON)
	}
	if f, ok := w.(*os.File); ok && sdservice.OnJournal(f, os.Getenv) {
		return slog.New(sdservice.PriorityHandler(w, mk)), nil
	}
	return slog.New(mk(w)), nil
}
