// SPDX-License-Identifier: MIT

// Command rr is the benchmark's TCP request/response latency probe (what
// netperf TCP_RR measures; Debian does not ship netperf): a client sends a
// small request on one TCP connection (TCP_NODELAY), waits for the
// server's echo of it, records the round trip, sleeps for the interval and
// repeats, a bounded number of times; it prints the percentiles as JSON.
//
//	rr serve -listen 203.0.113.2:5001
//	rr client -addr 203.0.113.2:5001 -count 500 -interval 20ms -size 64
//
// The server echoes every connection until the peer closes it; it runs
// until killed. The client gives up after -timeout in total.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/airlock-vpn/airlock/bench/record"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "rr:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return errors.New("usage: rr serve|client [flags]")
	}
	fs := flag.NewFlagSet("rr "+args[0], flag.ContinueOnError)
	switch args[0] {
	case "serve":
		listen := fs.String("listen", "", "address to listen on")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		return serve(*listen)
	case "client":
		addr := fs.String("addr", "", "server address")
		count := fs.Int("count", 500, "round trips (1..100000)")
		interval := fs.Duration("interval", 20*time.Millisecond, "pause between round trips")
		size := fs.Int("size", 64, "request and response size in bytes (1..65536)")
		timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long in total")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if *count < 1 || *count > 100000 || *size < 1 || *size > 65536 {
			return errors.New("-count must be 1..100000 and -size 1..65536")
		}
		res, err := client(*addr, *count, *size, *interval, *timeout)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(res)
	}
	return fmt.Errorf("unknown subcommand %q", args[0])
}

func serve(listen string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	fmt.Println("rr: listening on", l.Addr())
	for {
		c, err := l.Accept()
		if err != nil {
			return fmt.Errorf("accept: %w", err)
		}
		go func() {
			defer c.Close()
			_, _ = io.Copy(c, c)
		}()
	}
}

// Result is what the client prints.
type Result struct {
	N     int     `json:"n"`
	P50ms float64 `json:"p50_ms"`
	P99ms float64 `json:"p99_ms"`
	Maxms float64 `json:"max_ms"`
}

func client(addr string, count, size int, interval, timeout time.Duration) (Result, error) {
	deadline := time.Now().Add(timeout)
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return Result{}, fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	_ = c.SetDeadline(deadline)
	req, resp := make([]byte, size), make([]byte, size)
	rtts := make([]time.Duration, 0, count)
	for i := 0; i < count; i++ {
		req[0] = byte(i)
		t0 := time.Now()
		if _, err := c.Write(req); err != nil {
			return Result{}, fmt.Errorf("round trip %d: write: %w", i, err)
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			return Result{}, fmt.Errorf("round trip %d: read: %w", i, err)
		}
		rtts = append(rtts, time.Since(t0))
		if resp[0] != req[0] {
			return Result{}, fmt.Errorf("round trip %d: echo out of order", i)
		}
		time.Sleep(interval)
	}
	return summarize(rtts), nil
}

// summarize returns the nearest-rank percentiles of rtts in milliseconds.
func summarize(rtts []time.Duration) Result {
	if len(rtts) == 0 {
		return Result{}
	}
	ms := make([]float64, len(rtts))
	for i, d := range rtts {
		ms[i] = float64(d.Microseconds()) / 1000
	}
	_, max := record.Range(ms)
	return Result{N: len(ms), P50ms: record.Percentile(ms, 50), P99ms: record.Percentile(ms, 99), Maxms: max}
}
