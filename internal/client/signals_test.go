// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// recorder is a job's signal function that records what it gets.
type recorder struct {
	mu  sync.Mutex
	got []os.Signal // guarded by mu
	ch  chan struct{}
}

func newRecorder() *recorder { return &recorder{ch: make(chan struct{}, 16)} }

func (r *recorder) signal(s os.Signal) error {
	r.mu.Lock()
	r.got = append(r.got, s)
	r.mu.Unlock()
	r.ch <- struct{}{}
	return nil
}

func (r *recorder) signals() []os.Signal {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.got)
}

// TestJobSignals: no signal is lost between setup and the job. Before
// starting a signal interrupts setup; between starting and started it is
// queued and reaches the job when started names it; a job that could not
// be made hands queued signals back to setup.
func TestJobSignals(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	t.Run("setup", func(t *testing.T) {
		ctx, s, stop := catchSignals(context.Background(), log)
		defer stop()
		s.route(syscall.SIGTERM)
		err := s.starting(ctx)
		if err == nil || !strings.Contains(err.Error(), "interrupted by terminated before the job started") {
			t.Fatalf("starting after SIGTERM in setup: %v, want the interruption", err)
		}
	})
	t.Run("queued-then-forwarded", func(t *testing.T) {
		ctx, s, stop := catchSignals(context.Background(), log)
		defer stop()
		if err := s.starting(ctx); err != nil {
			t.Fatal(err)
		}
		// The job's process is being made: these are the job's.
		s.route(syscall.SIGTERM)
		s.route(syscall.SIGHUP)
		if ctx.Err() != nil {
			t.Fatalf("a signal while the job starts interrupted setup: %v", context.Cause(ctx))
		}
		r := newRecorder()
		s.started(r.signal)
		s.route(syscall.SIGINT)
		want := []os.Signal{syscall.SIGTERM, syscall.SIGHUP, syscall.SIGINT}
		if got := r.signals(); !slices.Equal(got, want) {
			t.Errorf("job got %v, want %v", got, want)
		}
	})
	t.Run("not-started", func(t *testing.T) {
		ctx, s, stop := catchSignals(context.Background(), log)
		defer stop()
		if err := s.starting(ctx); err != nil {
			t.Fatal(err)
		}
		s.route(syscall.SIGTERM)
		s.notStarted()
		if err := s.starting(ctx); err == nil {
			t.Fatal("starting again after a signal while the first try failed: no error, want the interruption")
		}
	})
	t.Run("real-signal", func(t *testing.T) {
		// A signal sent to the process right after started reaches the
		// job, every time: the old hand-over (a goroutine selecting
		// between the signal and "job started") could swallow it.
		for i := 0; i < 200; i++ {
			ctx, s, stop := catchSignals(context.Background(), log)
			if err := s.starting(ctx); err != nil {
				t.Fatal(err)
			}
			r := newRecorder()
			s.started(r.signal)
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
			select {
			case <-r.ch:
			case <-time.After(10 * time.Second):
				t.Fatalf("try %d: SIGHUP after the job started did not reach it (ctx: %v)", i, context.Cause(ctx))
			}
			stop()
		}
	})
}
