package e2e

import (
	"sort"
	"testing"
	"time"
)

// BenchmarkRunTrue measures `airlock run -- true` end to end as the
// unprivileged user on the compute node: join over TLS, namespace and TUN
// set-up, WireGuard start, exec, exit and release. It reports the median and
// p95 wall time besides ns/op.
//
//	go test -run '^$' -bench RunTrue -benchtime 50x ./test/e2e
func BenchmarkRunTrue(b *testing.B) {
	e := newEnv(b)
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		code, _, stderr := e.run(b, "true")
		durs = append(durs, time.Since(t0))
		if code != 0 {
			b.Fatalf("airlock run -- true: exit %d: %s", code, stderr)
		}
	}
	b.StopTimer()
	sort.Slice(durs, func(i, j int) bool { return durs[i] < durs[j] })
	b.ReportMetric(float64(durs[len(durs)/2].Microseconds())/1000, "median-ms")
	b.ReportMetric(float64(durs[(len(durs)*95)/100].Microseconds())/1000, "p95-ms")
}
