// SPDX-License-Identifier: MIT

// Package loadgen runs many Airlock jobs' client sides in one process, to
// load a gateway the way thousands of `airlock run` processes would,
// without one namespace or process per job (`airlock-testpeer jobs`,
// bench/ scale measurements, test/e2e's scale test).
//
// # Theory of operation
//
// Every simulated job is airlock run's own client session
// (internal/client.Session): its own control clients (its own pinned TLS
// connection), a join with the token and a fresh WireGuard key that waits
// out a busy gateway exactly as airlock run does, a real wireguard-go
// device with its own UDP socket doing the real handshake with the
// gateway (over the TCP/TLS transport if UDP does not complete one, as
// with --transport auto), and Supervise: the control session over the
// join's connection, renewals, reconnects after a loss or a gateway
// restart, failover to another gateway. What is not real is the job's
// side of the device: a channel TUN (chanTUN) instead of a kernel TUN in
// a namespace. Through it the job sends hand-made IPv4/UDP datagrams to an
// outside UDP echo server and waits for the echo: traffic through the
// tunnel, the gateway's egress, its port blocks and flow table.
//
// Latencies are measured per job: join (the control API's answer, waits
// included), handshake (device up until the first handshake completes)
// and first echo. Gen.Probe measures how long until every job's traffic
// flows again (after a gateway restart).
//
// Several gateways (Config.Gateway "a:8443,b:8443,c:8443"): every job
// joins the least loaded one (client.Rank, inside the session) and fails
// over as airlock run does. Reports give the spread of jobs over the
// gateways, and Probe the latencies per gateway the jobs were on when it
// began (after one was killed: how long until its jobs' traffic flows
// through the others).
package loadgen

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/client"
	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// Config configures a Gen.
type Config struct {
	Logger *slog.Logger
	// Gateway is HOST:PORT of the control API, or several separated by
	// commas; Pin its fingerprint, or one per gateway (as airlock run's
	// --gateway and --pin); Token a join token valid on all of them.
	Gateway, Pin, Token string
	// FailoverAfter is how long a job's gateway may be lost before the
	// job moves to another (several gateways); 0 means airlock run's
	// default, client.DefaultFailoverAfter.
	FailoverAfter time.Duration
	// JoinTimeout is how long a job waits for a gateway that cannot take
	// it yet; 0 means airlock run's default, client.DefaultJoinTimeout.
	JoinTimeout time.Duration
	// Transport is the WireGuard transport (client.TransportAuto when
	// empty).
	Transport string
	// N is the number of jobs; they start evenly spread over Over (0:
	// all at once).
	N    int
	Over time.Duration
	// Echo, if valid, is a UDP echo server outside; every job sends a
	// datagram through its tunnel and waits for the echo after joining and
	// then every EchoEvery (0: only once).
	Echo      netip.AddrPort
	EchoEvery time.Duration
	// Timeout bounds each control request, the first handshake and each
	// echo (default 10 s).
	Timeout time.Duration
	// JobPrefix names the jobs' batch job ids (PREFIX-N; default
	// "load").
	JobPrefix string
}

// Gen is a set of running simulated jobs. Its methods are safe for
// concurrent use.
type Gen struct {
	cfg  Config
	log  *slog.Logger
	jobs []*job

	// errMu guards errs: error text → count, for the report.
	errMu sync.Mutex
	errs  map[string]int
}

// job is one simulated job.
type job struct {
	g     *Gen
	i     int
	sess  *client.Session
	tun   *chanTUN
	sport uint16

	started                 time.Time
	joinLat, hsLat, echoLat time.Duration
	ok                      bool

	echoMu   sync.Mutex // one echo at a time per job
	seq      atomic.Uint32
	echoOK   atomic.Uint64
	echoFail atomic.Uint64
}

// New checks cfg and returns a Gen with no jobs running yet.
func New(cfg Config) (*Gen, error) {
	if cfg.N < 1 {
		return nil, fmt.Errorf("loadgen: %d jobs", cfg.N)
	}
	if cfg.Logger == nil {
		return nil, errors.New("loadgen: no logger")
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.JobPrefix == "" {
		cfg.JobPrefix = "load"
	}
	return &Gen{cfg: cfg, log: cfg.Logger, errs: map[string]int{}}, nil
}

// Start starts the jobs, spread over cfg.Over, and returns once every job
// has joined, done its handshake and (with Echo) its first echo, or
// failed. Jobs keep their sessions until ctx ends; Close releases them.
// The report describes the start.
func (g *Gen) Start(ctx context.Context) Report {
	g.jobs = make([]*job, g.cfg.N)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range g.jobs {
		j := &job{g: g, i: i, sport: uint16(20000 + i%40000)}
		g.jobs[i] = j
		if g.cfg.Over > 0 && g.cfg.N > 1 {
			at := t0.Add(g.cfg.Over * time.Duration(i) / time.Duration(g.cfg.N))
			if d := time.Until(at); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
				}
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := j.start(ctx); err != nil {
				g.countErr(err)
				j.abandon()
				return
			}
			j.ok = true
			go j.sess.Supervise(ctx)
			if g.cfg.Echo.IsValid() && g.cfg.EchoEvery > 0 {
				go j.echoes(ctx)
			}
		}()
	}
	wg.Wait()
	r := g.report("start")
	r.Seconds = time.Since(t0).Seconds()
	return r
}

// Probe makes every running job send echoes (every 200 ms, each waiting
// up to 1 s) until one comes back, for at most limit, and reports how long
// each took from the call: after a gateway restart, how long until every
// job's traffic flows again.
func (g *Gen) Probe(ctx context.Context, limit time.Duration) Report {
	t0 := time.Now()
	lat := make([]time.Duration, 0, len(g.jobs))
	byGW := map[string][]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	failed := 0
	for _, j := range g.jobs {
		if !j.ok {
			continue
		}
		gw := j.sess.Gateway()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Since(t0) < limit && ctx.Err() == nil {
				if err := j.echo(ctx, time.Second); err == nil {
					d := time.Since(t0)
					mu.Lock()
					lat = append(lat, d)
					byGW[gw] = append(byGW[gw], d)
					mu.Unlock()
					return
				}
				time.Sleep(200 * time.Millisecond)
			}
			mu.Lock()
			failed++
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := Report{Phase: "probe", Jobs: len(lat) + failed, OK: len(lat), Failed: failed, Echo: summarize(lat), Seconds: time.Since(t0).Seconds()}
	if g.multi() {
		r.ProbeByGateway = map[string]Summary{}
		for gw, d := range byGW {
			r.ProbeByGateway[gw] = summarize(d)
		}
		r.Gateways = g.spread()
	}
	return r
}

// Snapshot reports the running jobs' counters so far.
func (g *Gen) Snapshot() Report { return g.report("snapshot") }

// Close releases every lease (over each job's control session) and stops
// every device. Cancel the context given to Start first.
func (g *Gen) Close() {
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for _, j := range g.jobs {
		if j == nil || !j.ok {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			j.sess.Release()
			j.sess.Close()
		}()
	}
	wg.Wait()
}

func (g *Gen) countErr(err error) {
	g.errMu.Lock()
	defer g.errMu.Unlock()
	msg := err.Error()
	if len(msg) > 160 {
		msg = msg[:160]
	}
	g.errs[msg]++
}

// start joins, brings the device up, waits for the handshake and the first
// echo.
func (j *job) start(ctx context.Context) error {
	g := j.g
	j.started = time.Now()
	gws, err := client.ParseGateways(g.cfg.Gateway, g.cfg.Pin, g.cfg.Timeout)
	if err != nil {
		return fmt.Errorf("control client: %w", err)
	}
	priv, err := wgkey.Generate()
	if err != nil {
		return err
	}
	j.sess = client.NewSession(client.SessionConfig{
		Logger: g.log, Gateways: gws, Key: priv,
		Join: control.JoinRequest{Token: g.cfg.Token,
			Job: control.JobInfo{BatchJobID: g.cfg.JobPrefix + "-" + strconv.Itoa(j.i), BatchSystem: "loadgen", Hostname: "loadgen", User: "load", Command: "loadgen"}},
		Transport: g.cfg.Transport, FailoverAfter: g.cfg.FailoverAfter, JoinTimeout: g.cfg.JoinTimeout,
	})
	if err := j.sess.Join(ctx); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	j.joinLat = time.Since(j.started)
	j.tun = newChanTUN(j.sess.Lease().MTU)
	up := time.Now()
	if err := j.sess.StartTunnel(ctx, j.tun); err != nil {
		return fmt.Errorf("wireguard: %w", err)
	}
	if !j.sess.WaitHandshake(ctx, time.Time{}, g.cfg.Timeout) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errors.New("no wireguard handshake")
	}
	j.hsLat = time.Since(up)
	if g.cfg.Echo.IsValid() {
		t := time.Now()
		if err := j.echo(ctx, g.cfg.Timeout); err != nil {
			return err
		}
		j.echoLat = time.Since(t)
	}
	return nil
}

// abandon releases the lease of a job that failed after its join and
// stops its device, so that its lease does not linger until it expires.
func (j *job) abandon() {
	if j.sess == nil {
		return
	}
	j.sess.Release()
	j.sess.Close()
}

// echoes sends an echo every EchoEvery (the first at a random point of
// the interval, so that the jobs' echoes spread) until ctx ends.
func (j *job) echoes(ctx context.Context) {
	g := j.g
	t := time.NewTimer(time.Duration(rand.Int64N(int64(g.cfg.EchoEvery))))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := j.echo(ctx, g.cfg.Timeout); err != nil {
			if ctx.Err() != nil {
				return
			}
			j.echoFail.Add(1)
		} else {
			j.echoOK.Add(1)
		}
		t.Reset(g.cfg.EchoEvery)
	}
}

// echo sends one datagram to the echo server through the tunnel and waits
// up to timeout for it, or the answer to an earlier one of this job's
// echoes, to come back: a late answer proves the path as well, and a job
// that took only its latest datagram's answer never saw one once the
// path's delay was longer than its timeout (10,000 jobs retrying every
// 1.2 s then kept the gateway's queues full of answers nobody took).
func (j *job) echo(ctx context.Context, timeout time.Duration) error {
	j.echoMu.Lock()
	defer j.echoMu.Unlock()
	seq := j.seq.Add(1)
	mine := fmt.Sprintf("%s-%d-", j.g.cfg.JobPrefix, j.i)
	payload := []byte(mine + strconv.FormatUint(uint64(seq), 10))
	pkt := udpPacket(j.sess.JobAddr(), j.sport, j.g.cfg.Echo, payload)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case j.tun.out <- pkt:
	case <-t.C:
		return errors.New("echo: tunnel does not take the datagram")
	case <-ctx.Done():
		return ctx.Err()
	}
	for {
		select {
		case p := <-j.tun.in:
			if got, ok := udpPayload(p, j.g.cfg.Echo, j.sport); ok && strings.HasPrefix(string(got), mine) {
				return nil
			}
		case <-t.C:
			return errors.New("echo: no answer")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Report summarizes a phase.
type Report struct {
	Phase string `json:"phase"`
	// Jobs started, OK the ones that worked, Failed the others.
	Jobs, OK, Failed int
	// Seconds is how long the phase took.
	Seconds float64 `json:"seconds"`
	// Latencies of the jobs that got that far.
	Join      Summary `json:"join"`
	Handshake Summary `json:"handshake"`
	Echo      Summary `json:"echo"`
	// Counters of running jobs (client.SessionStats): WatchErrors counts
	// control sessions lost and reopened, Failovers moves to another
	// gateway.
	EchoOK, EchoFail, RenewErrors, WatchErrors, Restarts, Failovers uint64
	// Rejoins counts jobs joining again because the gateway had lost
	// their lease.
	Rejoins uint64 `json:",omitempty"`
	// Gateways is the spread with several gateways: running jobs per
	// gateway (its address as given) at the report.
	Gateways map[string]int `json:"gateways,omitempty"`
	// ProbeByGateway are a probe's latencies by the gateway each job was
	// on when the probe began (several gateways).
	ProbeByGateway map[string]Summary `json:"probe_by_gateway,omitempty"`
	// Errors counts failures by message.
	Errors map[string]int `json:"errors,omitempty"`
}

// Summary is a latency distribution in milliseconds.
type Summary struct {
	N                  int
	P50, P90, P99, Max float64
}

func summarize(d []time.Duration) Summary {
	if len(d) == 0 {
		return Summary{}
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(a, b int) bool { return s[a] < s[b] })
	q := func(p float64) float64 {
		i := int(p*float64(len(s))+0.5) - 1
		i = min(max(i, 0), len(s)-1)
		return float64(s[i].Microseconds()) / 1000
	}
	return Summary{N: len(s), P50: q(0.50), P90: q(0.90), P99: q(0.99), Max: float64(s[len(s)-1].Microseconds()) / 1000}
}

// multi reports whether the jobs are given several gateways.
func (g *Gen) multi() bool { return strings.Contains(g.cfg.Gateway, ",") }

// spread counts the running jobs by their current gateway.
func (g *Gen) spread() map[string]int {
	out := map[string]int{}
	for _, j := range g.jobs {
		if j != nil && j.ok {
			out[j.sess.Gateway()]++
		}
	}
	return out
}

func (g *Gen) report(phase string) Report {
	r := Report{Phase: phase, Jobs: len(g.jobs)}
	var join, hs, echo []time.Duration
	for _, j := range g.jobs {
		if j == nil {
			continue
		}
		if j.ok {
			r.OK++
		} else {
			r.Failed++
		}
		if j.joinLat > 0 {
			join = append(join, j.joinLat)
		}
		if j.hsLat > 0 {
			hs = append(hs, j.hsLat)
		}
		if j.echoLat > 0 {
			echo = append(echo, j.echoLat)
		}
		r.EchoOK += j.echoOK.Load()
		r.EchoFail += j.echoFail.Load()
		if j.ok {
			st := j.sess.Stats()
			r.RenewErrors += st.RenewErrors
			r.WatchErrors += st.Lost
			r.Restarts += st.Restarts
			r.Failovers += st.Failovers
			r.Rejoins += st.Rejoins
		}
	}
	if g.multi() {
		r.Gateways = g.spread()
	}
	r.Join, r.Handshake, r.Echo = summarize(join), summarize(hs), summarize(echo)
	g.errMu.Lock()
	if len(g.errs) > 0 {
		r.Errors = make(map[string]int, len(g.errs))
		for k, v := range g.errs {
			r.Errors[k] = v
		}
	}
	g.errMu.Unlock()
	return r
}

// udpPacket builds an IPv4/UDP datagram (UDP checksum 0: none, allowed
// over IPv4).
func udpPacket(src netip.Addr, sport uint16, dst netip.AddrPort, payload []byte) []byte {
	p := make([]byte, 28+len(payload))
	p[0] = 0x45
	binary.BigEndian.PutUint16(p[2:], uint16(len(p)))
	p[8] = 64
	p[9] = 17
	s4, d4 := src.As4(), dst.Addr().As4()
	copy(p[12:16], s4[:])
	copy(p[16:20], d4[:])
	binary.BigEndian.PutUint16(p[10:], ipChecksum(p[:20]))
	binary.BigEndian.PutUint16(p[20:], sport)
	binary.BigEndian.PutUint16(p[22:], dst.Port())
	binary.BigEndian.PutUint16(p[24:], uint16(8+len(payload)))
	copy(p[28:], payload)
	return p
}

// udpPayload returns the payload of p if it is an IPv4/UDP datagram from
// src to port dport.
func udpPayload(p []byte, src netip.AddrPort, dport uint16) ([]byte, bool) {
	if len(p) < 28 || p[0]>>4 != 4 || p[9] != 17 {
		return nil, false
	}
	ihl := int(p[0]&0x0f) * 4
	if len(p) < ihl+8 {
		return nil, false
	}
	s, _ := netip.AddrFromSlice(p[12:16])
	u := p[ihl:]
	if s != src.Addr() || binary.BigEndian.Uint16(u[0:]) != src.Port() || binary.BigEndian.Uint16(u[2:]) != dport {
		return nil, false
	}
	return u[8:], true
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
