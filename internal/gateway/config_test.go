// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/ipproto"
	"github.com/airlock-vpn/airlock/internal/proxy/proxytest"
	"github.com/airlock-vpn/airlock/test/topology"
)

const policyV1 = `version = 1
[[policy.rule]]
name = "no-smtp"
action = "deny"
proto = "tcp"
ports = [25]
`

// policyV2 is policyV1 with port 80 denied as well, and a flow limit for
// every job.
const policyV2 = `version = 1
[[policy.rule]]
name = "no-smtp"
action = "deny"
proto = "tcp"
ports = [25, 80]
[limits.job]
max_flows = 100
`

// TestConfigReload runs a gateway with a config file: its deny rule refuses
// a port at once, a reload applies a new rule to new flows without
// touching an open connection, and a broken reload keeps the old policy and
// reports file:line.
func TestConfigReload(t *testing.T) {
	echoSrv := proxytest.TCPServer(t, proxytest.Echo)
	file := filepath.Join(t.TempDir(), "gateway.toml")
	if err := os.WriteFile(file, []byte(policyV1), 0o600); err != nil {
		t.Fatal(err)
	}
	reload := make(chan struct{}, 1)
	g := startGatewayWith(t, func(c *Config) { c.ConfigFile = file; c.Reload = reload },
		remote{job: "198.51.100.7:80", real: echoSrv.String()},
		remote{job: "198.51.100.7:25", real: echoSrv.String()})
	j := joinJob(t, g, newToken(t, g))

	dial := func(addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		start := time.Now()
		c, err := j.net.DialContext(ctx, "tcp", addr)
		if err != nil && time.Since(start) > 2*time.Second {
			t.Errorf("dial %s: refused after %v, want at once", addr, time.Since(start))
		}
		return c, err
	}
	echo := func(c net.Conn) error {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("x")); err != nil {
			return err
		}
		b := make([]byte, 1)
		_, err := io.ReadFull(c, b)
		return err
	}
	open, err := dial("198.51.100.7:80")
	if err != nil {
		t.Fatalf("port 80 under policy v1: %v", err)
	}
	defer open.Close()
	if c, err := dial("198.51.100.7:25"); err == nil {
		c.Close()
		t.Error("port 25 allowed, want refused by no-smtp")
	}

	adm, err := admin.Dial(g.state)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	ctx := context.Background()

	// A broken file: the reload fails with file:line, the old policy stays.
	if err := os.WriteFile(file, []byte(policyV2+"porst = 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.Reload(ctx); err == nil || !strings.Contains(err.Error(), file+":9: limits.job.porst: unknown key") {
		t.Errorf("broken reload: %v, want an error naming %s:9: limits.job.porst", err, file)
	}
	if c, err := dial("198.51.100.7:80"); err != nil {
		t.Errorf("port 80 after a broken reload: %v, want allowed (old policy)", err)
	} else {
		c.Close()
	}

	// A good reload through the admin socket, then one through Reload
	// (SIGHUP).
	if err := os.WriteFile(file, []byte(policyV2), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := adm.Reload(ctx)
	if err != nil || res.Rules != 1 || res.File != file || res.Jobs != 1 {
		t.Fatalf("reload: %+v, %v; want 1 rule and the running job re-limited", res, err)
	}
	if c, err := dial("198.51.100.7:80"); err == nil {
		c.Close()
		t.Error("port 80 allowed after the reload, want refused")
	}
	if err := echo(open); err != nil {
		t.Errorf("connection opened before the reload: %v, want it untouched", err)
	}
	if err := os.WriteFile(file, []byte(policyV1), 0o600); err != nil {
		t.Fatal(err)
	}
	reload <- struct{}{}
	var c net.Conn
	if !topology.PollEvery(5*time.Second, 50*time.Millisecond, func() bool {
		c, err = dial("198.51.100.7:80")
		return err == nil
	}) {
		t.Fatalf("port 80 still refused 5 s after a SIGHUP reload of policy v1: %v", err)
	}
	// A round trip, so that the gateway has the handshake's last ACK
	// before the job goes away.
	if err := echo(c); err != nil {
		t.Errorf("echo after the SIGHUP reload: %v", err)
	}
	c.Close()
}

// TestConfigAtStart checks that a broken config file stops the gateway
// before it listens, naming file and line, and that a config file and limit
// flags cannot be combined.
func TestConfigAtStart(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "gateway.toml")
	os.WriteFile(file, []byte("version = 1\n[[policy.rule]]\naction = \"deny\"\nto = [\"10.0.0.0/33\"]\n"), 0o600)
	cfg := Config{Logger: slog.New(slog.DiscardHandler), StateDir: filepath.Join(dir, "state"), Listen: "127.0.0.1:0", ConfigFile: file}
	err := Run(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), file+":4: policy.rule[1].to") {
		t.Errorf("Run with a broken config: %v, want %s:4: policy.rule[1].to", err, file)
	}
	if _, serr := os.Stat(cfg.StateDir); serr == nil {
		t.Error("the state directory was created although the config is broken")
	}
	cfg.ConfigFile = filepath.Join(dir, "missing.toml")
	if err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("Run with a missing config: %v", err)
	}
	os.WriteFile(file, []byte("version = 1\n"), 0o600)
	cfg.ConfigFile = file
	cfg.Limits.Job.MaxFlows = 4
	if err := Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), "cannot be combined") {
		t.Errorf("Run with --config and limit flags: %v", err)
	}
}

func TestExposureAllowed(t *testing.T) {
	c, err := config.Parse("x.toml", []byte("version = 1\n[[expose]]\ntokens = [\"web\"]\nports = [\"8000-8999\"]\n"))
	if err != nil {
		t.Fatal(err)
	}
	g := newGateway(Config{})
	g.conf.Store(c)
	ok := []forward.Exposure{{Proto: ipproto.TCP, JobPort: 8080}, {Proto: ipproto.UDP, JobPort: 8999}}
	if err := g.admit.exposureAllowed("web", ok); err != nil {
		t.Errorf("web 8080/tcp 8999/udp: %v", err)
	}
	if err := g.admit.exposureAllowed("web", []forward.Exposure{{Proto: ipproto.TCP, JobPort: 22}}); err == nil || !strings.Contains(err.Error(), "[[expose]]") {
		t.Errorf("web 22/tcp: %v, want refused naming [[expose]]", err)
	}
	if err := g.admit.exposureAllowed("other", ok[:1]); err == nil {
		t.Error("other 8080/tcp: allowed, want refused")
	}
	g.conf.Store(config.Default())
	if err := g.admit.exposureAllowed("other", ok); err != nil {
		t.Errorf("no config file: %v, want every exposure allowed", err)
	}
}
