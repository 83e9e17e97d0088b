package client

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/control/controltest"
)

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestRenewLoopLeaseGone checks that a lease the gateway ended (kick) or
// forgot is reported on stderr once, loudly, with the gateway's reason,
// and that renewing stops.
func TestRenewLoopLeaseGone(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want []string
	}{
		{"kicked", fmt.Errorf("%w: ended by the gateway's admin (airlock kick): maintenance", control.ErrLeaseEnded),
			[]string{"THE GATEWAY ENDED THIS JOB'S LEASE", "airlock kick): maintenance", "network through the gateway is cut"}},
		{"unknown", fmt.Errorf("%w: no such lease", control.ErrUnknownLease),
			[]string{"NO LONGER KNOWS THIS JOB'S LEASE", "network through the gateway is cut"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &controltest.Backend{RenewErr: c.err}
			g := controltest.Start(t, b, controltest.Options{})
			pin, err := control.ParsePin(g.Pin)
			if err != nil {
				t.Fatal(err)
			}
			cc, err := control.NewClient(g.Addr, pin, 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var stderr lockedBuf
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				renewLoop(ctx, slog.New(slog.DiscardHandler), &stderr, cc, control.LeaseRef{ID: "x", Secret: "y"}, 50*time.Millisecond)
			}()
			select {
			case <-done:
			case <-ctx.Done():
				t.Fatal("renewLoop did not stop after the lease was gone")
			}
			out := stderr.String()
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("stderr %q: want %q", out, w)
				}
			}
			if n := strings.Count(out, "airlock: THE GATEWAY"); n != 1 {
				t.Errorf("message printed %d times, want once", n)
			}
		})
	}
}
