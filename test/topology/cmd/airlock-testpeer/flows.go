// SPDX-License-Identifier: MIT

package main

// Peers for the flow limit tests:
//
//	tcpecho ADDR             accept TCP connections on ADDR and echo what each sends (60 s at most each)
//	tcpflows ADDR N HOLD     open N connections to ADDR (a tcpecho server) one after another (5 s connect
//	                         timeout each), keep the successful ones for HOLD, then check that each still
//	                         echoes; print "ok=K failed=M slowest_failure=D alive=A"
//	tcpburst ADDR N          open N connections to ADDR (a tcpecho server) one after another as fast as
//	                         possible, closing each at once (half-close, wait for the server's close);
//	                         print "ok=K failed=M slowest_failure=D"

import (
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

// runFlowPeer runs the subcommands above; it reports false for others.
func runFlowPeer(cmd string, args []string) (bool, error) {
	switch cmd {
	case "tcpecho":
		need(args, 1)
		return true, tcpEcho(args[0])
	case "tcpflows":
		need(args, 3)
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return true, err
		}
		hold, err := time.ParseDuration(args[2])
		if err != nil {
			return true, err
		}
		return true, tcpFlows(args[0], n, hold)
	case "tcpburst":
		need(args, 2)
		n, err := strconv.Atoi(args[1])
		if err != nil {
			return true, err
		}
		return true, tcpBurst(args[0], n)
	}
	return false, nil
}

func tcpEcho(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(60 * time.Second))
			_, _ = io.Copy(c, c)
		}()
	}
}

func tcpFlows(addr string, n int, hold time.Duration) error {
	var conns []net.Conn
	var failed int
	var slowest time.Duration
	var lastErr error
	for range n {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			failed++
			slowest = max(slowest, time.Since(start))
			lastErr = err
			continue
		}
		conns = append(conns, c)
	}
	time.Sleep(hold)
	alive := 0
	for _, c := range conns {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		b := []byte("x")
		if _, err := c.Write(b); err == nil {
			if _, err := io.ReadFull(c, b); err == nil && b[0] == 'x' {
				alive++
			}
		}
		c.Close()
	}
	fmt.Printf("ok=%d failed=%d slowest_failure=%v alive=%d\n", len(conns), failed, slowest.Round(time.Millisecond), alive)
	if lastErr != nil {
		fmt.Fprintf(os.Stderr, "last failure: %v\n", lastErr)
	}
	return nil
}

func tcpBurst(addr string, n int) error {
	var ok, failed int
	var slowest time.Duration
	var lastErr error
	for range n {
		start := time.Now()
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			failed++
			slowest = max(slowest, time.Since(start))
			lastErr = err
			continue
		}
		ok++
		// Close gracefully and wait for the server's close, so that the
		// connection is over (not still counted as open) before the next.
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, c)
		c.Close()
	}
	fmt.Printf("ok=%d failed=%d slowest_failure=%v\n", ok, failed, slowest.Round(time.Millisecond))
	if lastErr != nil {
		fmt.Fprintf(os.Stderr, "last failure: %v\n", lastErr)
	}
	return nil
}
