// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/syncbuf"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

func TestPlanMaxBlock(t *testing.T) {
	plan := func(lo, hi uint16, size int) egress {
		p, err := portblock.NewPlan(portblock.Range{Lo: lo, Hi: hi}, size)
		if err != nil {
			t.Fatal(err)
		}
		return egress{plan: p}
	}
	for _, tt := range []struct {
		name    string
		max     int
		e       egress
		want    int
		wantErr string
	}{
		{"default", 0, plan(20000, 59999, 256), 4, ""},
		{"default small base", 0, plan(20000, 59999, 64), 16, ""},
		{"default odd base", 0, plan(20000, 59999, 100), 11, ""},
		{"default clamped to the range", 0, plan(2000, 2511, 256), 2, ""},
		{"default base above it", 0, plan(20000, 59999, 2048), 1, ""},
		{"set", 4096, plan(20000, 59999, 256), 16, ""},
		{"below base", 128, plan(20000, 59999, 256), 0, "below --block-size 256"},
		{"not a multiple", 1000, plan(20000, 59999, 256), 0, "multiple of --block-size 256"},
		{"past the range", 1024, plan(2000, 2511, 256), 0, "more than the 512 ports"},
	} {
		got, err := planMaxBlock(Config{MaxBlockSize: tt.max}, tt.e)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: got %d, %v; want an error containing %q", tt.name, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("%s: got %d, %v; want %d", tt.name, got, err, tt.want)
		}
	}
}

// TestBlockSizePerJob runs a user-mode gateway with 8 blocks of 256 ports
// and --max-block-size 1024: a join that asks for 1,024 ports gets 4
// consecutive blocks as one range, one that asks for more is refused
// naming the limit, a token's block_size applies to joins that ask
// nothing, the history records every range, and after a restart the
// restored run still holds its blocks (a second 1,024 no longer fits,
// the last block does).
func TestBlockSizePerJob(t *testing.T) {
	host, err := portblock.HostEphemeralRange()
	if err != nil {
		t.Fatal(err)
	}
	ports := portblock.Range{Lo: host.Lo, Hi: host.Lo + 8*256 - 1}
	conf := filepath.Join(t.TempDir(), "airlock.toml")
	if err := os.WriteFile(conf, []byte("version = 1\n[quota.token.bulk]\nblock_size = 512\n[quota.token.huge]\nblock_size = 2048\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logBuf syncbuf.Buffer
	mod := func(c *Config) {
		c.EgressPorts, c.BlockSize, c.MaxBlockSize, c.ConfigFile = ports, 256, 1024, conf
	}
	g := startGatewayWith(t, func(c *Config) { mod(c); c.Logger = slog.New(slog.NewTextHandler(&logBuf, nil)) })
	if got := logBuf.String(); !strings.Contains(got, "block_size is above --max-block-size") || !strings.Contains(got, "key=quota.token.huge.block_size") {
		t.Errorf("start-up log lacks the warning about token huge's block_size 2048:\n%s", got)
	}
	tok := newToken(t, g)
	bulk, _, err := admin.CreateToken(context.Background(), g.state, "bulk", 0)
	if err != nil {
		t.Fatal(err)
	}
	huge, _, err := admin.CreateToken(context.Background(), g.state, "huge", 0)
	if err != nil {
		t.Fatal(err)
	}
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	join := func(cc *control.Client, tok, job string, n int) (control.Lease, error) {
		priv, _ := wgkey.Generate()
		return cc.Join(context.Background(), control.JoinRequest{Token: tok, PublicKey: priv.PublicKey(), Job: control.JobInfo{BatchJobID: job}, Ports: n})
	}
	size := func(ls control.Lease) int { return int(ls.Ports[1]) - int(ls.Ports[0]) + 1 }

	big, err := join(cc, tok, "mover", 1000)
	if err != nil {
		t.Fatalf("join asking for 1000 ports: %v", err)
	}
	if size(big) != 1024 || (int(big.Ports[0])-int(ports.Lo))%256 != 0 || big.Ports[1] > ports.Hi {
		t.Errorf("1000 ports asked: got %v, want 1024 ports starting on a block of %v", big.Ports, ports)
	}
	if _, err := join(cc, tok, "greedy", 1025); !errors.Is(err, control.ErrBadRequest) ||
		!strings.Contains(err.Error(), "1025 egress ports") || !strings.Contains(err.Error(), "limit of 1024 per job (--max-block-size)") {
		t.Errorf("join asking for 1025 ports: %v, want a bad request naming the limit and the flag", err)
	}
	if _, err := join(cc, huge, "huge", 0); !errors.Is(err, control.ErrBadRequest) || !strings.Contains(err.Error(), "quota.token.huge.block_size") {
		t.Errorf("join of a token whose block_size is above the limit: %v, want a bad request naming the key", err)
	}
	mid, err := join(cc, bulk, "bulk", 0)
	if err != nil || size(mid) != 512 {
		t.Fatalf("join of token bulk (block_size 512): %v, %v; want 512 ports", mid.Ports, err)
	}
	small, err := join(cc, tok, "small", 64)
	if err != nil || size(small) != 256 {
		t.Fatalf("join asking for 64 ports: %v, %v; want one block of 256", small.Ports, err)
	}
	for _, ls := range []control.Lease{mid, small} {
		if ls.Ports[0] <= big.Ports[1] && ls.Ports[1] >= big.Ports[0] {
			t.Errorf("ranges overlap: %v and %v", big.Ports, ls.Ports)
		}
	}
	cc.Close()
	g.stop()

	g2 := startGatewayWith(t, func(c *Config) { mod(c); c.StateDir = g.state })
	cc2, err := control.NewClient(g2.info.Control.String(), g2.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	if _, err := cc2.Renew(context.Background(), control.LeaseRef{ID: big.ID, Secret: big.Secret}); err != nil {
		t.Fatalf("renew the 1024-port lease after restart: %v", err)
	}
	if ls, err := join(cc2, tok, "mover-2", 1024); !errors.Is(err, control.ErrNoAddress) || !strings.Contains(err.Error(), "no 4 consecutive free port blocks") {
		t.Errorf("second 1024-port join with 1 block free: %v %v, want refused for lack of 4 consecutive blocks", ls.Ports, err)
	}
	last, err := join(cc2, tok, "last", 0)
	if err != nil || size(last) != 256 {
		t.Fatalf("join for the last block: %v, %v", last.Ports, err)
	}
	for _, ls := range []control.Lease{big, mid, small} {
		if last.Ports[0] <= ls.Ports[1] && last.Ports[1] >= ls.Ports[0] {
			t.Errorf("the last block %v overlaps restored range %v", last.Ports, ls.Ports)
		}
	}
	cc2.Close()
	g2.stop()

	st, err := store.Open(filepath.Join(g.state, DBFile), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, ls := range []control.Lease{big, mid, small, last} {
		for _, port := range []uint16{ls.Ports[0], ls.Ports[1]} {
			recs, err := st.Whois(ls.PublicAddrs[0], port, time.Now())
			if a, _ := firstAttribution(recs); err != nil || len(recs) != 1 || recs[0].ID != ls.ID || a.PortLo != ls.Ports[0] || a.PortHi != ls.Ports[1] {
				t.Errorf("whois %v:%d: %+v, %v; want exactly lease %s with %v", ls.PublicAddrs[0], port, recs, err, ls.ID, ls.Ports)
			}
		}
	}
}
