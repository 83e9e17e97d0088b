// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/config"
)

// liveCapture labels the metrics of admins' live captures.
const liveCapture = "live"

// feedSet runs the standing capture feeds ([[capture]] and --capture).
// Safe for concurrent use.
type feedSet struct {
	mu sync.Mutex
	// ctx is the gateway's run context, nil before runFeeds.
	ctx     context.Context
	running map[string]*runningFeed
}

type runningFeed struct {
	c      config.Capture
	cancel context.CancelFunc
	done   chan struct{}
}

// openCapture registers the capture metrics.
func (g *gateway) openCapture(reg *prometheus.Registry) error {
	if err := reg.Register(capture.NewCollector(g.capture)); err != nil {
		return fmt.Errorf("register capture metrics: %w", err)
	}
	return nil
}

// feedsOf returns the feeds of conf and the --capture flags.
func (g *gateway) feedsOf(conf *config.Config) []config.Capture {
	out := append([]config.Capture(nil), conf.Capture...)
	for i, to := range g.cfg.Capture {
		name := "flag"
		if i > 0 {
			name = fmt.Sprintf("flag%d", i+1)
		}
		out = append(out, config.Capture{Name: name, To: to})
	}
	return out
}

// runFeeds starts the feeds of the config in force and runs them until
// ctx ends.
func (g *gateway) runFeeds(ctx context.Context) {
	g.feeds.mu.Lock()
	g.feeds.ctx = ctx
	g.feeds.mu.Unlock()
	g.setFeeds(g.feedsOf(g.conf.Load()))
	<-ctx.Done()
	g.setFeeds(nil)
}

// setFeeds makes list the running feeds: feeds not in it, or changed,
// stop; new ones start.
func (g *gateway) setFeeds(list []config.Capture) {
	g.feeds.mu.Lock()
	defer g.feeds.mu.Unlock()
	if g.feeds.ctx == nil {
		return
	}
	want := map[string]config.Capture{}
	for _, c := range list {
		want[c.Name] = c
	}
	for name, rf := range g.feeds.running {
		ended := false
		select {
		case <-rf.done: // failed: a reload starts it again
			ended = true
		default:
		}
		if c, ok := want[name]; ok && c.Equal(rf.c) && !ended && g.feeds.ctx.Err() == nil {
			delete(want, name)
			continue
		}
		rf.cancel()
		<-rf.done
		delete(g.feeds.running, name)
	}
	if g.feeds.ctx.Err() != nil {
		return
	}
	if g.feeds.running == nil {
		g.feeds.running = map[string]*runningFeed{}
	}
	for name, c := range want {
		ctx, cancel := context.WithCancel(g.feeds.ctx)
		rf := &runningFeed{c: c, cancel: cancel, done: make(chan struct{})}
		g.feeds.running[name] = rf
		fc := capture.FeedConfig{To: c.To, TapConfig: capture.TapConfig{
			Name: c.Name, Filter: c.Filter, Tokens: c.Tokens, Jobs: c.Jobs, Snaplen: c.Snaplen, Buffer: c.BufferBytes,
			AttestedJobs: g.admit.attest.mode() != "",
		}}
		go func() {
			defer close(rf.done)
			capture.RunFeed(ctx, g.log.With("component", "capture"), g.capture, fc)
		}()
	}
}

// StartCapture implements admin.Gateway: a live capture of leases ids,
// ending with them.
func (ag *adminGateway) StartCapture(ids []string, req admin.CaptureRequest, f *capture.Filter) (*capture.Tap, func(), error) {
	t := ag.g.capture.NewTap(capture.TapConfig{Name: liveCapture, Filter: f, Jobs: ids, Snaplen: req.Snaplen, Buffer: req.Buffer, EndWithJobs: true})
	ag.g.capture.Attach(t)
	return t, func() { ag.g.capture.Detach(t) }, nil
}
