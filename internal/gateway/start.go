// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"fmt"
)

// Started is a gateway that Start runs in the background. Its methods are
// safe for concurrent use.
type Started struct {
	// Info is what the gateway announced when it was ready.
	Info   Info
	cancel context.CancelFunc
	done   chan struct{}
	err    error // Run's result, set before done is closed
}

// Start runs a gateway with cfg in the background and returns once every
// listener is open (cfg.Ready, if set, is called first), or with Run's
// error if it ends before. ctx bounds only that wait; the gateway runs
// until Stop. It is how in-process harnesses (tests, load generators) run
// a gateway.
func Start(ctx context.Context, cfg Config) (*Started, error) {
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s := &Started{cancel: cancel, done: make(chan struct{})}
	ready := make(chan Info, 1)
	announce := cfg.Ready
	cfg.Ready = func(i Info) {
		if announce != nil {
			announce(i)
		}
		ready <- i
	}
	go func() {
		s.err = Run(runCtx, cfg)
		close(s.done)
	}()
	select {
	case s.Info = <-ready:
		return s, nil
	case <-s.done:
		cancel()
		if s.err == nil {
			s.err = errors.New("gateway stopped before it was ready")
		}
		return nil, s.err
	case <-ctx.Done():
		cancel()
		<-s.done
		return nil, fmt.Errorf("gateway not ready: %w", context.Cause(ctx))
	}
}

// Stop stops the gateway and waits until it has, or until ctx ends (then
// the gateway keeps stopping in the background and ctx's error is
// returned). It returns Run's error; calling it again returns the same.
func (s *Started) Stop(ctx context.Context) error {
	s.cancel()
	select {
	case <-s.done:
		return s.err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
