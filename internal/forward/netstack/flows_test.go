// SPDX-License-Identifier: MIT

package netstack

import (
	"context"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/forward"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"github.com/airlock-vpn/airlock/internal/limits"
	"github.com/airlock-vpn/airlock/internal/policy"
	"github.com/airlock-vpn/airlock/internal/portblock"
	"github.com/airlock-vpn/airlock/test/topology"
)

// recLog collects flow records.
type recLog struct {
	mu   sync.Mutex
	recs []flows.Record
}

func (l *recLog) WriteRecord(r flows.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}

func (l *recLog) wait(t *testing.T, n int) []flows.Record {
	t.Helper()
	var got []flows.Record
	if !topology.Poll(5*time.Second, func() bool {
		l.mu.Lock()
		got = append([]flows.Record(nil), l.recs...)
		l.mu.Unlock()
		return len(got) >= n
	}) {
		t.Fatalf("flow records: got %d, want %d: %+v", len(got), n, got)
	}
	return got
}

// TestFlowAccounting sends known amounts each way over a TCP flow and a
// UDP flow and checks the flow table's live and final counts, and that a
// refused flow is recorded with its verdict.
func TestFlowAccounting(t *testing.T) {
	checkGoroutines(t)
	const up, down = 300_000, 1_000_000
	var conns atomic.Int32
	srv := listenTCP(t, func(c net.Conn) {
		first := conns.Add(1) == 1
		n, _ := io.Copy(io.Discard, c)
		if first && n != up {
			t.Errorf("server got %d bytes, want %d", n, up)
		}
		c.Write(make([]byte, down))
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n*2], from) // replies twice as long
		}
	}()
	log := &recLog{}
	tb := flows.New(flows.Config{Log: log, Idle: flows.DefaultTimeouts()})
	p := newPair(t, Config{Flows: tb, UDPIdleTimeout: 200 * time.Millisecond})
	p.dial.route("198.51.100.7:80", srv)
	p.dial.route("198.51.100.7:53", pc.LocalAddr().String())
	if err := p.s.AddJob(forward.Job{ID: "L", Addrs: []netip.Addr{jobAddr}, Ref: jobs.Ref{JobID: "42", Token: "tok"}}); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := p.jobDialTCP(ctx, "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(make([]byte, up)); err != nil {
		t.Fatal(err)
	}
	// The flow is opened once the handshake is done, maybe after the
	// job's write returned.
	var act []flows.Record
	topology.Poll(2*time.Second, func() bool {
		act = tb.Active(flows.Filter{Job: "42"})
		return len(act) != 0
	})
	if len(act) != 1 || act[0].Proto != "tcp" {
		t.Errorf("active flows during the transfer: %+v, want the TCP flow", act)
	}
	c.CloseWrite()
	n, err := io.Copy(io.Discard, c)
	if err != nil || n != down {
		t.Fatalf("job read %d bytes (%v), want %d", n, err, down)
	}
	c.Close()

	u := p.jobDialUDP(t, "198.51.100.7:53")
	buf := make([]byte, 64)
	got := 0
	for i := 0; i < 10; i++ {
		u.SetDeadline(time.Now().Add(time.Second))
		if _, err := u.Write([]byte("0123456789")); err != nil {
			t.Fatal(err)
		}
		if n, err := u.Read(buf); err == nil && n == 20 {
			got++
		}
	}
	u.Close()

	recs := log.wait(t, 2)
	var tcpRec, udpRec flows.Record
	for _, r := range recs {
		switch r.Proto {
		case "tcp":
			tcpRec = r
		case "udp":
			udpRec = r
		}
	}
	if tcpRec.BytesOut != up || tcpRec.BytesIn != down || tcpRec.JobID != "42" || tcpRec.Token != "tok" || tcpRec.Verdict != flows.Allowed {
		t.Errorf("tcp record: %+v, want bytes out %d in %d of job 42", tcpRec, up, down)
	}
	// Netstack segments: GRO and GSO merge many packets into one, so only
	// a floor holds: the handshake and FIN each way.
	if tcpRec.PacketsOut < 2 || tcpRec.PacketsIn < 2 {
		t.Errorf("tcp packets: out %d in %d, want at least 2 each way", tcpRec.PacketsOut, tcpRec.PacketsIn)
	}
	if tcpRec.Src != netip.AddrPortFrom(jobAddr, 0).Addr().String()+tcpRec.Src[len(jobAddr.String()):] || tcpRec.Dst != "198.51.100.7:80" {
		t.Errorf("tcp record tuple: %s → %s", tcpRec.Src, tcpRec.Dst)
	}
	if udpRec.PacketsOut < 10 || udpRec.BytesOut != 10*udpRec.PacketsOut || udpRec.PacketsIn != uint64(got) || udpRec.BytesIn != 20*uint64(got) || udpRec.EndReason != flows.EndIdle {
		t.Errorf("udp record: %+v, want 10-byte datagrams out, %d 20-byte ones in, ended idle", udpRec, got)
	}
	st := tb.Stats()
	if st.BytesOut != tcpRec.BytesOut+udpRec.BytesOut || st.BytesIn != tcpRec.BytesIn+udpRec.BytesIn {
		t.Errorf("table totals %+v disagree with the records", st.Traffic)
	}

	// A refused flow is recorded with its verdict.
	if err := p.s.SetJobLimits("L", limits.Job{MaxFlows: 1}); err != nil {
		t.Fatal(err)
	}
	c1, err := p.jobDialTCP(ctx, "198.51.100.7:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	if c2, err := p.jobDialTCP(ctx, "198.51.100.7:80"); err == nil {
		c2.Close()
		t.Fatal("second flow over MaxFlows 1 was not refused")
	}
	recs = log.wait(t, 3)
	if r := recs[len(recs)-1]; r.Verdict != flows.FlowLimit || r.JobID != "42" {
		t.Errorf("refusal record: %+v, want verdict %s", r, flows.FlowLimit)
	}
}

// TestFlowDenied checks that a flow the policy denies reaches the flow
// table with its rule as verdict, with the job's source port.
func TestFlowDenied(t *testing.T) {
	log := &recLog{}
	tb := flows.New(flows.Config{Log: log})
	p := newPair(t, Config{Flows: tb})
	if err := p.s.SetPolicy(&policy.Policy{Rules: []policy.Rule{
		{Name: "no-smtp", Action: policy.Deny, Proto: policy.ProtoTCP, Ports: []portblock.Range{{Lo: 25, Hi: 25}}},
	}}); err != nil {
		t.Fatal(err)
	}
	if err := p.s.AddJob(forward.Job{ID: "L", Addrs: []netip.Addr{jobAddr}, Ref: jobs.Ref{JobID: "9"}}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c, err := p.jobDialTCP(ctx, "198.51.100.7:25"); err == nil {
		c.Close()
		t.Fatal("dial to a denied port succeeded")
	}
	r := log.wait(t, 1)[0]
	src, err := netip.ParseAddrPort(r.Src)
	if r.Verdict != "denied:no-smtp" || r.Dst != "198.51.100.7:25" || r.JobID != "9" || err != nil || src.Addr() != jobAddr || src.Port() == 0 {
		t.Errorf("denied flow record %+v, want verdict denied:no-smtp from %s:PORT to 198.51.100.7:25", r, jobAddr)
	}
	if st := tb.Stats(); st.Verdicts["denied:no-smtp"] != 1 {
		t.Errorf("verdict counts %v, want denied:no-smtp 1", st.Verdicts)
	}
}
