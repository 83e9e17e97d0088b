// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// jobSignals routes the signals airlock run catches (SIGINT, SIGTERM,
// SIGHUP) so that none is lost between airlock's setup and the job:
//
//   - during setup a signal interrupts airlock (the context is cancelled
//     with the signal as its cause) and no job is started;
//   - from starting (called just before the job's process is created) on,
//     signals are the job's: queued until started names the process, then
//     forwarded in order, and every later one as it comes;
//   - notStarted (the process could not be made) hands queued signals back
//     to setup, where they interrupt airlock.
//
// One goroutine reads the signal channel for the whole run and decides
// under mu, so a signal that arrives while the job is being started goes
// either to setup (before starting) or to the job (after), never nowhere.
// Methods are safe for concurrent use; the zero value is not usable (see
// catchSignals).
type jobSignals struct {
	log    *slog.Logger
	cancel context.CancelCauseFunc

	mu      sync.Mutex
	state   signalState           // guarded by mu
	pending []os.Signal           // guarded by mu: caught while starting
	forward func(os.Signal) error // guarded by mu: the job's, once running
}

type signalState int

const (
	signalsInterrupt signalState = iota // setup: a signal cancels the context
	signalsQueue                        // the job is being started: queue
	signalsForward                      // the job runs: forward
)

// catchSignals starts catching SIGINT, SIGTERM and SIGHUP; stop undoes it
// (signals then get their default action again).
func catchSignals(ctx context.Context, log *slog.Logger) (context.Context, *jobSignals, func()) {
	sigc := make(chan os.Signal, 8)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	ctx, cancel := context.WithCancelCause(ctx)
	s := &jobSignals{log: log, cancel: cancel}
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			select {
			case sig := <-sigc:
				s.route(sig)
			case <-done:
				return
			}
		}
	}()
	return ctx, s, func() {
		signal.Stop(sigc)
		close(done)
		<-exited
		cancel(nil)
	}
}

// route acts on one caught signal according to the state.
func (s *jobSignals) route(sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case signalsInterrupt:
		s.cancel(fmt.Errorf("interrupted by %v before the job started", sig))
	case signalsQueue:
		s.pending = append(s.pending, sig)
	case signalsForward:
		s.forwardLocked(sig)
	}
}

func (s *jobSignals) forwardLocked(sig os.Signal) {
	s.log.Debug("forwarding signal to job", "signal", sig)
	if err := s.forward(sig); err != nil {
		s.log.Debug("forward signal", "signal", sig, "err", err)
	}
}

// starting is called just before the job's process is created: from now
// on signals are the job's. It returns the interruption instead if a
// signal (or ctx's parent) ended setup already; the job must then not be
// started.
func (s *jobSignals) starting(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	s.state = signalsQueue
	return nil
}

// started names the job's process by its signal function: the signals
// queued since starting go to it now, later ones as they come.
func (s *jobSignals) started(forward func(os.Signal) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state, s.forward = signalsForward, forward
	for _, sig := range s.pending {
		s.forwardLocked(sig)
	}
	s.pending = nil
}

// notStarted is called when the job's process could not be made after
// starting (e.g. a fallback mode turned out unavailable): signals interrupt
// setup again, and any queued since starting do so now.
func (s *jobSignals) notStarted() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state = signalsInterrupt
	if len(s.pending) > 0 {
		s.cancel(fmt.Errorf("interrupted by %v before the job started", s.pending[0]))
	}
	s.pending = nil
}
