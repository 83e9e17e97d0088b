// SPDX-License-Identifier: MIT

package flows

import (
	"bufio"
	"encoding/json"
	"errors"
	"github.com/airlock-vpn/airlock/internal/jobs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-vpn/airlock/internal/ipproto"
)

type memLog struct {
	mu   sync.Mutex
	recs []Record
	err  error
}

func (m *memLog) WriteRecord(r Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return m.err
	}
	m.recs = append(m.recs, r)
	return nil
}

func (m *memLog) all() []Record {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Record(nil), m.recs...)
}

var (
	jobA = netip.MustParseAddr("100.64.0.2")
	out1 = netip.MustParseAddrPort("192.0.2.10:443")
	xrd  = netip.MustParseAddrPort("198.51.100.7:1094")
)

func key(proto ipproto.Proto, src, dst netip.AddrPort) Key {
	return Key{Proto: proto, Src: src, Dst: dst}
}

func TestFlowLifecycle(t *testing.T) {
	ml := &memLog{}
	bulk, err := ParseBulkRules("198.51.100.0/24:1094")
	if err != nil {
		t.Fatal(err)
	}
	tb := New(Config{Log: ml, Bulk: bulk, Idle: DefaultTimeouts()})
	addJob(t, tb, "L1", jobs.Ref{JobID: "1234", Token: "cms"}, jobA)

	f := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 40000), out1), Egress)
	f.AddOut(100, 0)
	f.AddIn(1000, 0)
	f.AddIn(500, 0)
	f.SetPacketCounter(func() (uint64, uint64) { return 3, 4 })
	b := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 40001), xrd), Egress)
	b.AddIn(1<<20, 10)

	if got := tb.Active(Filter{Job: "1234"}); len(got) != 2 {
		t.Fatalf("active flows of job 1234: got %d, want 2", len(got))
	}
	if got := tb.Active(Filter{Job: "nope"}); len(got) != 0 {
		t.Fatalf("active flows of job nope: got %d, want 0", len(got))
	}
	js := tb.Jobs()
	if len(js) != 1 || js[0].BytesIn != 1500+1<<20 || js[0].BytesOut != 100 || js[0].ActiveFlows != 2 {
		t.Fatalf("job stats: got %+v", js)
	}
	f.End(EndClosed)
	f.End(EndIdle) // no effect
	b.End(EndClosed)

	recs := ml.all()
	if len(recs) != 1 {
		t.Fatalf("log records: got %d, want 1 (the bulk flow is not logged): %+v", len(recs), recs)
	}
	r := recs[0]
	for _, c := range []struct {
		name      string
		got, want any
	}{
		{"proto", r.Proto, "tcp"},
		{"src", r.Src, "100.64.0.2:40000"},
		{"dst", r.Dst, "192.0.2.10:443"},
		{"job", r.JobID, "1234"},
		{"lease", r.Lease, jobs.ID("L1")},
		{"token", r.Token, "cms"},
		{"direction", r.Direction, Egress},
		{"verdict", r.Verdict, Allowed},
		{"bytes_out", r.BytesOut, uint64(100)},
		{"bytes_in", r.BytesIn, uint64(1500)},
		{"packets_out", r.PacketsOut, uint64(3)},
		{"packets_in", r.PacketsIn, uint64(4)},
		{"end_reason", r.EndReason, EndClosed},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
	if r.End.IsZero() || r.End.Before(r.Start) {
		t.Errorf("end %v, start %v", r.End, r.Start)
	}
	st := tb.Stats()
	if st.ActiveFlows != 0 || st.Flows != 2 || st.Verdicts[Allowed] != 2 {
		t.Errorf("stats: got %+v", st)
	}
	if st.BytesIn != 1500+1<<20 || st.PacketsIn != 4+10 || st.PacketsOut != 3 {
		t.Errorf("totals: got %+v", st.Traffic)
	}
	if len(st.Bulk) != 1 || st.Bulk[0].Flows != 1 || st.Bulk[0].BytesIn != 1<<20 || st.Bulk[0].PacketsIn != 10 {
		t.Errorf("bulk: got %+v", st.Bulk)
	}
}

func TestInboundJobAttribution(t *testing.T) {
	tb := New(Config{})
	addJob(t, tb, "L1", jobs.Ref{}, jobA)
	f := tb.Open(key(ProtoTCP, out1, netip.AddrPortFrom(jobA, 8080)), Inbound)
	f.AddOut(7, 1)
	if js := tb.Jobs(); js[0].BytesOut != 7 || js[0].ActiveFlows != 1 {
		t.Fatalf("inbound flow not attributed to the job: %+v", js)
	}
	f.End(EndClosed)
	if js := tb.Jobs(); js[0].ActiveFlows != 0 {
		t.Fatalf("active flows after end: %+v", js)
	}
}

func TestSetAbsolute(t *testing.T) {
	tb := New(Config{})
	addJob(t, tb, "L1", jobs.Ref{}, jobA)
	f := tb.Open(key(ProtoUDP, netip.AddrPortFrom(jobA, 5353), out1), Egress)
	for _, c := range []struct{ bo, po, bi, pi uint64 }{{10, 1, 0, 0}, {30, 2, 50, 1}, {20, 1, 50, 1}, {30, 2, 80, 2}} {
		f.Set(c.bo, c.po, c.bi, c.pi)
	}
	st := tb.Stats()
	if st.BytesOut != 30 || st.PacketsOut != 2 || st.BytesIn != 80 || st.PacketsIn != 2 {
		t.Fatalf("totals after absolute updates: got %+v, want out 30/2 in 80/2", st.Traffic)
	}
}

func TestRefuseRateLimited(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	addJob(t, tb, "L1", jobs.Ref{JobID: "j"}, jobA)
	const n = refusalLogBurst + 30
	for range n {
		tb.Refuse(key(ProtoTCP, netip.AddrPortFrom(jobA, 1), out1), Egress, FlowLimit)
	}
	tb.Refuse(key(ProtoTCP, netip.AddrPortFrom(jobA, 1), out1), Egress, Denied("no-smtp"))
	st := tb.Stats()
	if st.Verdicts[FlowLimit] != n || st.Verdicts["denied:no-smtp"] != 1 {
		t.Errorf("verdict counts: got %v", st.Verdicts)
	}
	recs := ml.all()
	if len(recs) < refusalLogBurst || len(recs) > refusalLogBurst+2 {
		t.Errorf("logged refusals: got %d, want about the burst %d", len(recs), refusalLogBurst)
	}
	if recs[0].Verdict != FlowLimit || recs[0].JobID != "j" {
		t.Errorf("first refusal record: %+v", recs[0])
	}
	time.Sleep(150 * time.Millisecond) // one token
	tb.Refuse(key(ProtoTCP, netip.AddrPortFrom(jobA, 1), out1), Egress, FlowLimit)
	last := ml.all()
	if r := last[len(last)-1]; r.Suppressed == 0 {
		t.Errorf("record after suppression: suppressed = 0, want > 0")
	}
}

type closeCount struct{ n int }

func (c *closeCount) Close() error { c.n++; return nil }

func TestIdleSweep(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml, Idle: Timeouts{TCP: time.Hour, UDP: 50 * time.Millisecond}})
	u := tb.Open(key(ProtoUDP, netip.AddrPortFrom(jobA, 1), out1), Egress)
	tc := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 2), out1), Egress)
	var cu, ct closeCount
	u.SetCloser(&cu)
	tc.SetCloser(&ct)
	tb.sweep(time.Now().Add(100 * time.Millisecond))
	if cu.n != 1 || ct.n != 0 || !u.Ended() || tc.Ended() {
		t.Fatalf("after sweep: udp closed %d ended %v, tcp closed %d ended %v; want only udp", cu.n, u.Ended(), ct.n, tc.Ended())
	}
	if recs := ml.all(); len(recs) != 1 || recs[0].EndReason != EndIdle {
		t.Fatalf("records: %+v", recs)
	}
	tb.EndAll(EndStopped)
	if recs := ml.all(); len(recs) != 2 || recs[1].EndReason != EndStopped {
		t.Fatalf("records after EndAll: %+v", recs)
	}
}

func TestLogWriteErrorCounted(t *testing.T) {
	ml := &memLog{err: errors.New("disk full")}
	tb := New(Config{Log: ml})
	tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 2), out1), Egress).End(EndClosed)
	if st := tb.Stats(); st.LogErrors != 1 {
		t.Fatalf("log errors: got %d, want 1", st.LogErrors)
	}
}

func TestAddAllocs(t *testing.T) {
	tb := New(Config{})
	addJob(t, tb, "L1", jobs.Ref{}, jobA)
	f := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 2), out1), Egress)
	if n := testing.AllocsPerRun(1000, func() { f.AddOut(1400, 1); f.AddIn(1400, 1) }); n != 0 {
		t.Fatalf("AddOut/AddIn allocate %v per call, want 0", n)
	}
}

func TestLogFileRotation(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "flows.log")
	l, err := OpenLog(path, 1, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("flow log mode %v, want 0600", fi.Mode().Perm())
	}
	r := Record{ID: 1, Proto: "tcp", Src: strings.Repeat("x", 1000), Verdict: Allowed}
	for range 1500 { // ~1.5 MB: one rotation
		if err := l.WriteRecord(r); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Errorf("files after 1.5 MB with 1 MB rotation: %d, want 2 (current and one backup)", len(ents))
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var got Record
		if err := json.Unmarshal(sc.Bytes(), &got); err != nil || got.ID != 1 {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
	}
}

func TestOpenLogBadPath(t *testing.T) {
	if _, err := OpenLog(filepath.Join(t.TempDir(), "no", "such", "\x00dir", "flows.log"), 0, 0); err == nil {
		t.Fatal("OpenLog on a bad path succeeded")
	}
}

func TestParseBulkRule(t *testing.T) {
	for _, c := range []struct {
		in     string
		prefix string
		lo, hi uint16
		err    bool
	}{
		{"192.0.2.0/24:1094", "192.0.2.0/24", 1094, 1094, false},
		{"192.0.2.7/24", "192.0.2.0/24", 0, 0, false},
		{"192.0.2.7", "192.0.2.7/32", 0, 0, false},
		{"192.0.2.7:1094-1096", "192.0.2.7/32", 1094, 1096, false},
		{"2001:db8::/32:1094", "2001:db8::/32", 1094, 1094, false},
		{"2001:db8::1", "2001:db8::1/128", 0, 0, false},
		{"[2001:db8::1]:80", "2001:db8::1/128", 80, 80, false},
		{" 10.0.0.0/8 ", "10.0.0.0/8", 0, 0, false},
		{"", "", 0, 0, true},
		{"host.example:1094", "", 0, 0, true},
		{"192.0.2.0/33", "", 0, 0, true},
		{"192.0.2.0/24:0", "", 0, 0, true},
		{"192.0.2.0/24:70000", "", 0, 0, true},
		{"192.0.2.0/24:10-5", "", 0, 0, true},
		{"192.0.2.0/24:", "", 0, 0, true},
		{"[2001:db8::1", "", 0, 0, true},
		{"[2001:db8::1]x", "", 0, 0, true},
	} {
		r, err := ParseBulkRule(c.in)
		if c.err {
			if err == nil {
				t.Errorf("ParseBulkRule(%q) = %+v, want an error", c.in, r)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseBulkRule(%q): %v", c.in, err)
			continue
		}
		if r.Prefix.String() != c.prefix || r.Lo != c.lo || r.Hi != c.hi {
			t.Errorf("ParseBulkRule(%q) = %v %d-%d, want %s %d-%d", c.in, r.Prefix, r.Lo, r.Hi, c.prefix, c.lo, c.hi)
		}
	}
}

func TestBulkMatch(t *testing.T) {
	r, _ := ParseBulkRule("198.51.100.0/24:1094-1095")
	all, _ := ParseBulkRule("198.51.100.0/24")
	for _, c := range []struct {
		r     BulkRule
		proto ipproto.Proto
		ap    string
		want  bool
	}{
		{r, ProtoTCP, "198.51.100.7:1094", true},
		{r, ProtoUDP, "198.51.100.7:1095", true},
		{r, ProtoTCP, "198.51.100.7:1096", false},
		{r, ProtoTCP, "198.51.101.7:1094", false},
		{r, ProtoICMP, "198.51.100.7:1094", false},
		{all, ProtoICMP, "198.51.100.7:0", true},
		{all, ProtoTCP, "[::ffff:198.51.100.7]:80", true},
	} {
		if got := c.r.Match(c.proto, netip.MustParseAddrPort(c.ap)); got != c.want {
			t.Errorf("%s.Match(%d, %s) = %v, want %v", c.r.Name, c.proto, c.ap, got, c.want)
		}
	}
}

func TestParseBulkRules(t *testing.T) {
	rs, err := ParseBulkRules("192.0.2.1:1094, 198.51.100.0/24,,")
	if err != nil || len(rs) != 2 {
		t.Fatalf("got %v, %v; want 2 rules", rs, err)
	}
	if _, err := ParseBulkRules("192.0.2.1:1094,nonsense"); err == nil || !strings.Contains(err.Error(), "nonsense") {
		t.Fatalf("got %v, want an error naming the bad rule", err)
	}
}

// FuzzParseBulkRule checks that any rule that parses is canonical: its
// prefix is masked and valid, its ports ordered, and it matches its own
// network address.
func FuzzParseBulkRule(f *testing.F) {
	for _, s := range []string{"192.0.2.0/24:1094", "[2001:db8::1]:80", "2001:db8::/32:1-2", "10.0.0.1", "::ffff:1.2.3.4/120:5"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseBulkRule(s)
		if err != nil {
			return
		}
		if !r.Prefix.IsValid() || r.Prefix != r.Prefix.Masked() || r.Prefix.Addr().Is4In6() {
			t.Fatalf("%q: prefix %v not canonical", s, r.Prefix)
		}
		if r.Lo > r.Hi || (r.Lo == 0) != (r.Hi == 0) {
			t.Fatalf("%q: ports %d-%d", s, r.Lo, r.Hi)
		}
		if !r.Match(ProtoTCP, netip.AddrPortFrom(r.Prefix.Addr(), max(r.Lo, 1))) {
			t.Fatalf("%q: does not match its own address", s)
		}
	})
}

func TestRecent(t *testing.T) {
	tb := New(Config{})
	addJob(t, tb, "L1", jobs.Ref{JobID: "a"}, jobA)
	for i := range recentLen + 10 {
		f := tb.Open(key(ProtoUDP, netip.AddrPortFrom(jobA, uint16(i+1)), out1), Egress)
		f.End(EndClosed)
	}
	got := tb.Recent(Filter{Job: "a"})
	if len(got) != recentLen {
		t.Fatalf("recent: got %d, want %d", len(got), recentLen)
	}
	if got[0].Src != netip.AddrPortFrom(jobA, 11).String() || got[len(got)-1].Src != netip.AddrPortFrom(jobA, recentLen+10).String() {
		t.Errorf("recent order: first %s last %s", got[0].Src, got[len(got)-1].Src)
	}
	if n := len(tb.Recent(Filter{Job: "b"})); n != 0 {
		t.Errorf("recent of another job: %d", n)
	}
}

func TestCloseJob(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	jobB := netip.MustParseAddr("100.64.0.3")
	addJob(t, tb, "LA", jobs.Ref{}, jobA)
	addJob(t, tb, "LB", jobs.Ref{}, jobB)
	a := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobA, 1), out1), Egress)
	b := tb.Open(key(ProtoTCP, netip.AddrPortFrom(jobB, 1), out1), Egress)
	var ca, cb closeCount
	a.SetCloser(&ca)
	b.SetCloser(&cb)
	tb.CloseJob("LA", EndJob)
	if ca.n != 1 || cb.n != 0 || !a.Ended() || b.Ended() {
		t.Fatalf("CloseJob(jobA): a closed %d ended %v, b closed %d ended %v", ca.n, a.Ended(), cb.n, b.Ended())
	}
	if recs := ml.all(); len(recs) != 1 || recs[0].EndReason != EndJob {
		t.Fatalf("records: %+v", recs)
	}
}

// TestRecordPublicAddr: a job's egress address reaches every record of its
// flows, in the flow log's JSON as public_addr.
func TestRecordPublicAddr(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml, Idle: DefaultTimeouts()})
	pub := netip.MustParseAddr("203.0.113.7")
	if err := tb.Index().Add("L1", jobA); err != nil {
		t.Fatal(err)
	}
	tb.AddJob("L1", jobs.Ref{}, pub)
	tb.Open(key(ProtoUDP, netip.AddrPortFrom(jobA, 40000), out1), Egress).End(EndClosed)
	ml.mu.Lock()
	defer ml.mu.Unlock()
	if len(ml.recs) != 1 || ml.recs[0].PublicAddr != pub {
		t.Fatalf("records %+v, want one with public address %v", ml.recs, pub)
	}
	b, err := json.Marshal(ml.recs[0])
	if err != nil || !strings.Contains(string(b), `"public_addr":"203.0.113.7"`) {
		t.Errorf("record JSON %s (%v), want public_addr", b, err)
	}
}

// addJob indexes addrs as job id's and registers the job in tb.
func addJob(t *testing.T, tb *Table, id jobs.ID, ref jobs.Ref, addrs ...netip.Addr) {
	t.Helper()
	if err := tb.Index().Add(id, addrs...); err != nil {
		t.Fatal(err)
	}
	tb.AddJob(id, ref)
}

// TestJobOfBothFamilies: the flows of every tunnel address of a job are
// the job's, with the job's first address and the public address of the
// flow's family in their records, and are found and closed by the job.
func TestJobOfBothFamilies(t *testing.T) {
	ml := &memLog{}
	tb := New(Config{Log: ml})
	a4, a6 := netip.MustParseAddr("100.64.0.2"), netip.MustParseAddr("fd00::6440:2")
	pub4, pub6 := netip.MustParseAddr("203.0.113.1"), netip.MustParseAddr("2001:db8::1")
	if err := tb.Index().Add("L1", a4, a6); err != nil {
		t.Fatal(err)
	}
	tb.AddJob("L1", jobs.Ref{JobID: "42"}, pub4, pub6)
	out6 := netip.MustParseAddrPort("[2001:db8:1::10]:443")
	f4 := tb.Open(key(ProtoTCP, netip.AddrPortFrom(a4, 40000), out1), Egress)
	f6 := tb.Open(key(ProtoTCP, netip.AddrPortFrom(a6, 40001), out6), Egress)
	f6.AddOut(10, 1)
	for _, c := range []struct {
		filter string
		want   int
	}{{"L1", 2}, {a4.String(), 2}, {a6.String(), 2}, {"42", 2}, {"fd00::1", 0}} {
		if n := len(tb.Active(Filter{Job: c.filter})); n != c.want {
			t.Errorf("Active(%s): %d flows, want %d", c.filter, n, c.want)
		}
	}
	if js := tb.Jobs(); len(js) != 1 || js[0].Addr != a4 || js[0].BytesOut != 10 || js[0].ActiveFlows != 2 {
		t.Errorf("job stats %+v, want one job at %v with both flows", js, a4)
	}
	tb.CloseJob("L1", EndJob)
	if !f4.Ended() || !f6.Ended() {
		t.Fatal("CloseJob left a flow of the job open")
	}
	recs := ml.all()
	if len(recs) != 2 {
		t.Fatalf("records %+v", recs)
	}
	for _, r := range recs {
		want := pub4
		if r.Src == netip.AddrPortFrom(a6, 40001).String() {
			want = pub6
		}
		if r.Lease != "L1" || r.JobAddr != a4.String() || r.PublicAddr != want || r.JobID != "42" {
			t.Errorf("record %+v: want lease L1, job address %v, public %v", r, a4, want)
		}
	}
	// An address of no job stays itself.
	tb.Refuse(key(ProtoUDP, netip.MustParseAddrPort("100.64.0.99:1"), out1), Egress, FlowLimit)
	if r := ml.all()[2]; r.Lease != "" || r.JobAddr != "100.64.0.99" {
		t.Errorf("refusal of an unknown address: %+v", r)
	}
}
