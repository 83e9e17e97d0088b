// SPDX-License-Identifier: MIT

package gateway

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/tun/netstack"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/tunnel"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"github.com/airlock-vpn/airlock/test/topology"
)

// testGateway runs a gateway on loopback whose outgoing flows to the
// documentation address 198.51.100.7 land on local listeners, so the whole
// path runs in-process and without privileges.
type testGateway struct {
	info  Info
	state string
	stop  func()
}

// remote maps the job-visible destination to a loopback listener.
type remote struct {
	job  string // what the job dials, e.g. 198.51.100.7:80
	real string // loopback address of the listener
}

func startGateway(t testing.TB, remotes ...remote) *testGateway {
	t.Helper()
	return startGatewayWith(t, nil, remotes...)
}

// startGatewayAt is startGateway on state directory state.
func startGatewayAt(t testing.TB, state string, remotes ...remote) *testGateway {
	t.Helper()
	return startGatewayWith(t, func(c *Config) { c.StateDir = state }, remotes...)
}

// startGatewayWith is startGateway with mod (if not nil) applied to the
// gateway's Config.
func startGatewayWith(t testing.TB, mod func(*Config), remotes ...remote) *testGateway {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	var d net.Dialer
	cfg := Config{
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
		StateDir: state,
		Listen:   "127.0.0.1:0",
		// Long enough that a lease outlives a loaded machine's pauses
		// (the harness does not renew); TestJoinErrors shortens it.
		RenewInterval: 2 * time.Second,
		LeaseTTL:      10 * time.Second,
		DNSUpstreams:  []netip.AddrPort{netip.MustParseAddrPort("127.0.0.1:1")},
		ExposePorts:   &policy.Exposure{Rules: []policy.ExposeRule{{Ports: []portblock.Range{{Lo: 8080, Hi: 8080}}}}},
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			for _, r := range remotes {
				if r.job == address {
					return d.DialContext(ctx, network, r.real)
				}
			}
			return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
		},
	}
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	if mod != nil {
		mod(&cfg)
	}
	if cfg.ConfigFile != "" {
		cfg.ExposePorts = nil // the file's [[expose]] rules decide
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sg, err := Start(ctx, cfg)
	if err != nil {
		t.Fatalf("start gateway: %v", err)
	}
	g := &testGateway{info: sg.Info, state: cfg.StateDir}
	var once sync.Once
	g.stop = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := sg.Stop(ctx); errors.Is(err, context.DeadlineExceeded) {
				buf := make([]byte, 1<<20)
				t.Errorf("gateway did not stop within 5s\n%s", buf[:runtime.Stack(buf, true)])
			} else if err != nil {
				t.Errorf("gateway run: %v", err)
			}
		})
	}
	t.Cleanup(g.stop)
	return g
}

// testJob is a job whose "namespace" is a user-space stack on the client's
// WireGuard device.
type testJob struct {
	lease control.Lease
	net   *netstack.Net
	wg    *tunnel.Client
	cc    *control.Client
}

func joinJob(t testing.TB, g *testGateway, token string) *testJob {
	t.Helper()
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	priv, err := wgkey.Generate()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ls, err := cc.Join(ctx, control.JoinRequest{Token: token, PublicKey: priv.PublicKey(), Job: control.JobInfo{BatchJobID: "t1"}})
	if err != nil {
		t.Fatalf("join: %v", err)
	}
	dev, tnet, err := netstack.CreateNetTUN([]netip.Addr{ls.Addresses[0].Addr()}, ls.DNS, ls.MTU)
	if err != nil {
		t.Fatal(err)
	}
	gwKey := ls.GatewayPublicKey
	ep := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), g.info.UDPPort)
	wg, err := tunnel.NewClient(slog.New(slog.NewTextHandler(io.Discard, nil)), dev, nil, priv, gwKey, ep)
	if err != nil {
		t.Fatal(err)
	}
	j := &testJob{lease: ls, net: tnet, wg: wg, cc: cc}
	t.Cleanup(func() { wg.Close(); cc.Close() })
	return j
}

func newToken(t testing.TB, g *testGateway) string {
	t.Helper()
	tok, _, err := admin.CreateToken(context.Background(), g.state, "", 0)
	if err != nil {
		t.Fatalf("create token while gateway runs: %v", err)
	}
	return tok
}

// TestInProcessTCP runs client ↔ gateway over loopback UDP with user-space
// stacks on both ends and moves data both ways through a real TCP listener.
func TestInProcessTCP(t *testing.T) {
	before := runtime.NumGoroutine()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const size = 4 << 20
	payload := bytes.Repeat([]byte("airlock!"), size/8)
	want := sha256.Sum256(payload)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				// Echo the hash of what the job sent, then a payload.
				h := sha256.New()
				if _, err := io.Copy(h, c); err != nil {
					return
				}
				c.Write(h.Sum(nil))
				c.Write(payload)
			}()
		}
	}()

	g := startGateway(t, remote{job: "198.51.100.7:80", real: ln.Addr().String()})
	j := joinJob(t, g, newToken(t, g))
	if len(j.lease.Addresses) == 0 || j.lease.Addresses[0].Addr() == j.lease.Gateways[0] {
		t.Fatalf("lease address %v, gateway %v", j.lease.Addresses, j.lease.Gateways[0])
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := j.net.DialContext(ctx, "tcp", "198.51.100.7:80")
	if err != nil {
		t.Fatalf("dial through tunnel: %v", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := c.Write(payload); err != nil {
		t.Fatalf("write: %v", err)
	}
	if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
		t.Fatalf("close write: %v", err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if len(got) != 32+size {
		t.Fatalf("got %d bytes back, want %d", len(got), 32+size)
	}
	if !bytes.Equal(got[:32], want[:]) {
		t.Errorf("gateway side received corrupted data")
	}
	if sha256.Sum256(got[32:]) != want {
		t.Errorf("job side received corrupted data")
	}
	if j.wg.LastHandshake().IsZero() {
		t.Errorf("no handshake recorded after a transfer")
	}

	// A refused destination resets the job's connection at once.
	t0 := time.Now()
	if _, err := j.net.DialContext(ctx, "tcp", "198.51.100.8:81"); err == nil {
		t.Errorf("dial to a refused destination succeeded")
	} else if time.Since(t0) > 5*time.Second {
		t.Errorf("refused dial took %v", time.Since(t0))
	}

	if err := j.cc.Release(ctx, control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret}); err != nil {
		t.Errorf("release: %v", err)
	}
	j.wg.Close()
	g.stop()
	topology.Poll(3*time.Second, func() bool { return runtime.NumGoroutine() <= before+2 })
	if n := runtime.NumGoroutine(); n > before+2 {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines: %d before, %d after\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// TestInProcessUDP sends datagrams through the tunnel to a real UDP echo.
func TestInProcessUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, a, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], a)
		}
	}()
	g := startGateway(t, remote{job: "198.51.100.7:7", real: pc.LocalAddr().String()})
	j := joinJob(t, g, newToken(t, g))
	c, err := j.net.DialUDPAddrPort(netip.AddrPort{}, netip.MustParseAddrPort("198.51.100.7:7"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 2048)
	for i := 0; i < 100; i++ {
		msg := []byte(strings.Repeat("x", i) + "!")
		var ok bool
		for try := 0; try < 5 && !ok; try++ {
			c.Write(msg)
			c.SetReadDeadline(time.Now().Add(time.Second))
			n, err := c.Read(buf)
			ok = err == nil && bytes.Equal(buf[:n], msg)
		}
		if !ok {
			t.Fatalf("datagram %d not echoed", i)
		}
	}
}

// TestJoinErrors covers a bad token, a bad pin and a lease that expires
// because its client stopped renewing.
func TestJoinErrors(t *testing.T) {
	g := startGatewayWith(t, func(c *Config) { c.RenewInterval, c.LeaseTTL = 200*time.Millisecond, 600*time.Millisecond })
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	priv, _ := wgkey.Generate()
	ctx := context.Background()
	_, err = cc.Join(ctx, control.JoinRequest{Token: "alk1_nope", PublicKey: priv.PublicKey()})
	if !errors.Is(err, control.ErrBadToken) {
		t.Errorf("bad token: got %v, want ErrBadToken", err)
	}

	bad := strings.Repeat("0", 64)
	cb, err := control.NewClient(g.info.Control.String(), "sha256:"+bad, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if _, err := cb.Health(ctx); !errors.Is(err, control.ErrPinMismatch) {
		t.Errorf("bad pin: got %v, want ErrPinMismatch", err)
	}

	ls, err := cc.Join(ctx, control.JoinRequest{Token: newToken(t, g), PublicKey: priv.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	h, err := cc.Health(ctx)
	if err != nil || h.Jobs != 1 {
		t.Fatalf("health after join: %+v, %v; want 1 job", h, err)
	}
	topology.Poll(5*time.Second, func() bool {
		h, _ = cc.Health(ctx)
		return h.Jobs == 0
	})
	if h.Jobs != 0 {
		t.Fatalf("lease did not expire: %+v", h)
	}
	if _, err := cc.Renew(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}); !errors.Is(err, control.ErrUnknownLease) {
		t.Errorf("renew after expiry: got %v, want ErrUnknownLease", err)
	}
}

// TestRestartKeepsIdentity checks that a second start with the same state
// directory presents the same pin.
func TestRestartKeepsIdentity(t *testing.T) {
	g := startGateway(t)
	b, err := os.ReadFile(filepath.Join(g.state, JoinEnvFile))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "AIRLOCK_PIN="+g.info.Fingerprint) {
		t.Errorf("join.env lacks the pin:\n%s", b)
	}
	fi, err := os.Stat(g.state)
	if err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("state dir mode: %v, %v; want 0700", fi.Mode().Perm(), err)
	}
	g.stop()
	ready := make(chan Info, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), StateDir: g.state, Listen: "127.0.0.1:0", Ready: func(i Info) { ready <- i }})
	}()
	select {
	case i := <-ready:
		if i.Fingerprint != g.info.Fingerprint {
			t.Errorf("pin after restart: got %s, want %s", i.Fingerprint, g.info.Fingerprint)
		}
	case err := <-done:
		t.Fatalf("restart failed: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("restart not ready")
	}
	cancel()
	<-done
}

// TestLeaseHistory checks that a join and a release are recorded in the
// state db, where whois and the admin read them after the gateway stopped.
func TestLeaseHistory(t *testing.T) {
	g := startGateway(t)
	cc, err := control.NewClient(g.info.Control.String(), g.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	priv, _ := wgkey.Generate()
	ctx := context.Background()
	ls, err := cc.Join(ctx, control.JoinRequest{Token: newToken(t, g), PublicKey: priv.PublicKey(),
		Job: control.JobInfo{BatchJobID: "slurm-77", BatchSystem: "slurm", User: "alice", Hostname: "cn042"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := cc.Release(ctx, control.LeaseRef{ID: ls.ID, Secret: ls.Secret}); err != nil {
		t.Fatal(err)
	}
	g.stop()
	st, err := store.Open(filepath.Join(g.state, DBFile), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	recs, err := st.Leases()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("lease history: got %d records, want 1: %+v", len(recs), recs)
	}
	r := recs[0]
	if r.ID != ls.ID || r.JobID != "slurm-77" || r.User != "alice" || r.Host != "cn042" || r.TunnelAddr() != ls.Addresses[0].Addr() {
		t.Errorf("record: got %+v, want lease %s of slurm-77/alice/cn042 at %v", r, ls.ID, ls.Addresses[0].Addr())
	}
	if r.End.IsZero() || r.EndReason != "released" {
		t.Errorf("record end: got %v %q, want a time and \"released\"", r.End, r.EndReason)
	}
}

// TestListenPicksUDPTwin checks that a kernel-picked control port is one
// whose UDP twin is free: the WireGuard device binds it next (a taken
// twin failed the gateway's start on a busy machine).
func TestListenPicksUDPTwin(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	taken := pc.LocalAddr().(*net.UDPAddr).Port
	if udpFree(taken) {
		t.Errorf("udpFree(%d) with the port held: true", taken)
	}
	for range 50 {
		ln, err := listenTCP("127.0.0.1:0", true)
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		free := udpFree(port)
		ln.Close()
		if !free || port == taken {
			t.Fatalf("listenTCP picked port %d, whose UDP twin is taken", port)
		}
	}
}
