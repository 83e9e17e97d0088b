// SPDX-License-Identifier: MIT

package sdservice

import (
	"context"
	"io"
	"log/slog"
)

// Syslog priorities (syslog(3)) of slog's levels.
const (
	prioError   = 3
	prioWarning = 4
	prioInfo    = 6
	prioDebug   = 7
)

// Priority returns the syslog priority of an slog level: Error and above
// 3 (err), Warn 4 (warning), Info 6 (info), below Info 7 (debug).
func Priority(l slog.Level) int {
	switch {
	case l >= slog.LevelError:
		return prioError
	case l >= slog.LevelWarn:
		return prioWarning
	case l >= slog.LevelInfo:
		return prioInfo
	}
	return prioDebug
}

// PriorityHandler returns a handler that writes each record as the handler
// mk(w') would, on its own line prefixed with "<N>", N the record level's
// syslog priority: what journald reads from a stream as the line's
// priority (journalctl -p warning). mk's handler must write each record
// with one Write call, as slog's text and JSON handlers do. The handler is
// safe for concurrent use if w is.
func PriorityHandler(w io.Writer, mk func(io.Writer) slog.Handler) slog.Handler {
	var h priorityHandler
	for i, p := range []int{prioError, prioWarning, prioInfo, prioDebug} {
		h.byPrio[i] = mk(prefixWriter{w: w, prefix: []byte{'<', byte('0' + p), '>'}})
	}
	return h
}

// priorityHandler holds one handler per priority, error first.
type priorityHandler struct {
	byPrio [4]slog.Handler
}

func (h priorityHandler) pick(l slog.Level) slog.Handler {
	switch Priority(l) {
	case prioError:
		return h.byPrio[0]
	case prioWarning:
		return h.byPrio[1]
	case prioInfo:
		return h.byPrio[2]
	}
	return h.byPrio[3]
}

func (h priorityHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.pick(l).Enabled(ctx, l)
}

func (h priorityHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.pick(r.Level).Handle(ctx, r)
}

func (h priorityHandler) WithAttrs(as []slog.Attr) slog.Handler {
	for i := range h.byPrio {
		h.byPrio[i] = h.byPrio[i].WithAttrs(as)
	}
	return h
}

func (h priorityHandler) WithGroup(name string) slog.Handler {
	for i := range h.byPrio {
		h.byPrio[i] = h.byPrio[i].WithGroup(name)
	}
	return h
}

// prefixWriter writes prefix and then p in one Write, so that concurrent
// records do not interleave.
type prefixWriter struct {
	w      io.Writer
	prefix []byte
}

func (p prefixWriter) Write(b []byte) (int, error) {
	buf := make([]byte, 0, len(p.prefix)+len(b))
	buf = append(append(buf, p.prefix...), b...)
	if _, err := p.w.Write(buf); err != nil {
		return 0, err
	}
	return len(b), nil
}
