// SPDX-License-Identifier: MIT

package e2e

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkRunTrue measures `airlock run -- true` end to end as the
// unprivileged user on the compute node: join over TLS, namespace and TUN
// set-up, WireGuard start, exec, exit and release. The runs are timed by a
// shell loop inside one `ip netns exec`, so the figures are airlock's own,
// without the harness's per-command wrappers. It reports the median and
// p95 wall time of one run; ns/op is per run too.
//
//	go test -run '^$' -bench RunTrue -benchtime 50x ./test/e2e
func BenchmarkRunTrue(b *testing.B) {
	e := newEnv(b)
	script := fmt.Sprintf(`i=0
while [ $i -lt %d ]; do
	s=$(date +%%s%%N)
	%s run -- true || exit 1
	t=$(date +%%s%%N)
	echo $((t-s))
	i=$((i+1))
done`, b.N, e.airlock)
	cmd := []string{"env", "AIRLOCK_GATEWAY=" + e.gateway, "AIRLOCK_PIN=" + e.pin, "AIRLOCK_TOKEN=" + e.token, "sh", "-c", script}
	b.ResetTimer()
	code, out, stderr := e.tp.Run(b, time.Duration(b.N)*5*time.Second+30*time.Second, e.tp.CN, e.u, cmd[0], cmd[1:]...)
	b.StopTimer()
	if code != 0 {
		b.Fatalf("airlock run -- true loop: exit %d: %s%s", code, stderr, e.diag(stderr))
	}
	var durs []time.Duration
	for _, f := range strings.Fields(out) {
		ns, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("bad timing %q in %q", f, out)
		}
		durs = append(durs, time.Duration(ns))
	}
	if len(durs) != b.N {
		b.Fatalf("got %d timings, want %d: %q", len(durs), b.N, out)
	}
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(durs[(len(durs)*95)/100].Microseconds())/1000, "p95-ms")
}
