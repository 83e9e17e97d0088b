// SPDX-License-Identifier: MIT

package main

import (
	"fmt"
	"io"
	"log/slog"
)

// Log formats of --log-format.
const (
	logFormatText = "text"
	logFormatJSON = "json"
)

// newLoggerFormat returns a logger on w at the named level, in format
// text (logfmt-like key=value) or json (one object per line with time,
// level, msg and the record's attributes), for a site's log shipper.
func newLoggerFormat(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("bad --log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case logFormatText, "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case logFormatJSON:
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("bad --log-format %q: want %s or %s", format, logFormatText, logFormatJSON)
}
