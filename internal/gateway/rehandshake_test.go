// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/wgkey"
	"github.com/airlock-vpn/airlock/test/topology"
)

// TestRestartStartsHandshakes stops the gateway with a job whose
// WireGuard session is up and starts it again on the same state
// directory: the gateway kept the job's endpoint (DIR/endpoints) and
// starts the handshake itself, so the job's tunnel comes back without the
// job doing anything, and the job's traffic flows again.
func TestRestartStartsHandshakes(t *testing.T) {
	g := startGateway(t)
	j := joinJob(t, g, newToken(t, g))
	waitHandshakeAfter(t, j, time.Time{})
	g.stop()
	eps, err := readEndpoints(g.state)
	if err != nil {
		t.Fatal(err)
	}
	if ep := eps[j.lease.GatewayPublicKey]; ep.IsValid() {
		t.Errorf("the gateway's own key among the endpoints: %v", eps)
	}
	if len(eps) != 1 {
		t.Fatalf("endpoints after a clean stop: %v, want the job's", eps)
	}
	t0 := time.Now()
	g2 := startGatewayAt(t, g.state)
	waitHandshakeAfter(t, j, t0)
	t.Logf("the restarted gateway's handshake completed %v after its start", time.Since(t0).Round(time.Millisecond))
	// The job never re-handshook (its peer still points at the old
	// port): the gateway's initiation reached it, and it roamed.
	cc, err := control.NewClient(g2.info.Control.String(), g2.info.Fingerprint, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := cc.Renew(context.Background(), control.LeaseRef{ID: j.lease.ID, Secret: j.lease.Secret}); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	cc.Close()

	// The control: without the file the restarted gateway cannot reach
	// the job, and no handshake comes.
	g2.stop()
	if err := os.Remove(filepath.Join(g.state, EndpointsFile)); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	startGatewayAt(t, g.state)
	time.Sleep(2 * time.Second)
	if h := j.wg.LastHandshake(); h.After(t1) {
		t.Errorf("a handshake at %v although the gateway knew no endpoint: the test shows nothing", h)
	}
}

// waitHandshakeAfter waits up to 10 s for j's handshake later than after.
func waitHandshakeAfter(t *testing.T, j *testJob, after time.Time) {
	t.Helper()
	if !topology.Poll(10*time.Second, func() bool { return j.wg.LastHandshake().After(after) }) {
		t.Fatalf("no handshake after %v within 10 s", after.Format(time.StampMilli))
	}
}

// TestEndpointsFile: the endpoints file keeps both families and skips
// lines it cannot read.
func TestEndpointsFile(t *testing.T) {
	a, b := wgkey.Key{1}, wgkey.Key{3}
	eps := map[wgkey.Key]netip.AddrPort{a: netip.MustParseAddrPort("192.0.2.1:51820"), b: netip.MustParseAddrPort("[2001:db8::1]:1")}
	dir := t.TempDir()
	if err := writeEndpoints(dir, eps); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, EndpointsFile), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("garbage\nnot-a-key 192.0.2.9:1\n" + wgkey.Key{4}.String() + " not-an-endpoint\n")
	f.Close()
	got, err := readEndpoints(dir)
	if err != nil || len(got) != 2 || got[a] != eps[a] || got[b] != eps[b] {
		t.Errorf("endpoints round trip: %v, %v; want %v", got, err, eps)
	}
	if got, err := readEndpoints(t.TempDir()); err != nil || len(got) != 0 {
		t.Errorf("no file: %v, %v; want none", got, err)
	}
}
