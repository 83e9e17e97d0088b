// SPDX-License-Identifier: MIT

// Package fdlimit says when the gateway has run out of file descriptors:
// it recognises the error (EMFILE, ENFILE) wherever a socket is made or
// accepted and warns, at most once a minute, with the fix.
package fdlimit

import (
	"errors"
	"log/slog"
	"syscall"
	"time"

	"golang.org/x/time/rate"
)

// Exhausted reports whether err says the process or the system has no
// free file descriptor.
func Exhausted(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// Warner logs exhaustion at most once a minute, so that a job opening
// flows until the limit cannot flood the log. The zero value is not
// usable; make one with NewWarner.
type Warner struct {
	log *slog.Logger
	lim *rate.Limiter
}

// NewWarner returns a Warner that logs to log.
func NewWarner(log *slog.Logger) *Warner {
	return &Warner{log: log, lim: rate.NewLimiter(rate.Every(time.Minute), 1)}
}

// Note reports whether err is exhaustion and, if so and none was logged
// in the last minute, warns that what failed (e.g. "a job's connection
// failed"), with the fix and attrs.
func (w *Warner) Note(err error, what string, attrs ...any) bool {
	if !Exhausted(err) {
		return false
	}
	if w.lim.Allow() {
		w.log.Warn("out of file descriptors: "+what+"; raise the gateway's open-files limit (LimitNOFILE= in its systemd unit, ulimit -n): each job's session takes one and each of its flows one or two more",
			append(attrs, "err", err)...)
	}
	return true
}
