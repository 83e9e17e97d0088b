// SPDX-License-Identifier: MIT

// Command perfsum sorts the samples of a perf profile of Airlock's data
// path into the stages a packet goes through, so that a profile taken by
// `bench/run.sh --perf` can be compared before and after a change without
// reading call graphs:
//
//	perf script -i 'bench/results/STAMP/perf/POINT.gateway.data' | go run ./bench/perfsum
//
// A sample belongs to the first "anywhere" stage (in the order printed) any
// frame of its stack matches, so kernel work done inside a TUN write counts
// as the TUN's, not as the caller's; a sample no such stage claims belongs
// to the stage of its innermost frame that matches one (the code that was
// running, not the wireguard-go routine that called it).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// stage is one row of the summary: a sample whose stack has a frame
// containing any of match belongs to it.
type stage struct {
	name     string
	anywhere bool
	match    []string
}

var stages = []stage{
	{"encryption and decryption (ChaCha20-Poly1305)", true, []string{"chacha20poly1305", "poly1305.", "chacha20."}},
	{"kernel: TUN read/write (incl. the private kernel TCP's receive)", true, []string{"tun_chr_write_iter", "tun_chr_read_iter", "tun_get_user", "tun_do_read"}},
	{"kernel: WireGuard's UDP socket (sendmmsg/recvmmsg)", true, []string{"__sys_sendmmsg", "do_recvmmsg", "__x64_sys_sendmmsg", "__x64_sys_recvmmsg"}},
	{"relay: kernel TCP to host socket (splice, copy)", true, []string{"netstack.halfCopy", "netstack.spliceCopy", "__x64_sys_splice"}},
	{"wireguard-go: TUN offload (GSO split, GRO coalesce, checksums)", true, []string{"wireguard/tun.handleGRO", "wireguard/tun.gsoSplit", "wireguard/tun.handleVirtioRead", "wireguard/tun.tcpGRO", "wireguard/tun.checksum"}},
	{"wireguard-go: UDP batching (GSO/GRO on the socket)", true, []string{"conn.(*StdNetBind)", "ipv4.(*payloadHandler)", "ipv6.(*payloadHandler)", "x/net/internal/socket"}},
	{"wireguard-go: queues, routing, keys", false, []string{"wireguard/device."}},
	{"gVisor netstack", false, []string{"gvisor.dev/gvisor"}},
	{"Airlock's packet path (divert, capture, bypass, readdress, limits)", false, []string{"airlock-vpn/airlock/internal/"}},
	{"Go runtime (scheduler, GC, timers)", false, []string{"runtime."}},
	{"kernel: other", false, []string{"[kernel.kallsyms]"}},
}

func main() {
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: perf script -i PERF.data | perfsum")
		flag.PrintDefaults()
	}
	flag.Parse()
	counts, total, err := summarise(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "perfsum:", err)
		os.Exit(1)
	}
	if total == 0 {
		fmt.Fprintln(os.Stderr, "perfsum: no samples on standard input (pipe `perf script -i FILE` into it)")
		os.Exit(1)
	}
	fmt.Printf("| stage | share of samples |\n|---|---|\n")
	for i, s := range stages {
		fmt.Printf("| %s | %.1f %% |\n", s.name, 100*float64(counts[i])/float64(total))
	}
	fmt.Printf("| other | %.1f %% |\n", 100*float64(counts[len(stages)])/float64(total))
	fmt.Printf("\n%d samples\n", total)
}

// summarise reads perf script's output: a sample is a header line, its
// frames (indented) and a blank line.
func summarise(r io.Reader) (counts []int, total int, err error) {
	counts = make([]int, len(stages)+1)
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var frames []string
	flush := func() {
		if len(frames) == 0 {
			return
		}
		counts[classify(frames)]++
		total++
		frames = frames[:0]
	}
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush()
		case line[0] == ' ' || line[0] == '\t':
			frames = append(frames, line)
		default:
			flush()
		}
	}
	flush()
	return counts, total, sc.Err()
}

// classify returns the index of the stage a sample's frames (innermost
// first) belong to, or len(stages) for none.
func classify(frames []string) int {
	for i, s := range stages {
		if !s.anywhere {
			continue
		}
		for _, f := range frames {
			if s.matches(f) {
				return i
			}
		}
	}
	for _, f := range frames { // innermost first
		for i, s := range stages {
			if !s.anywhere && s.matches(f) {
				return i
			}
		}
	}
	return len(stages)
}

func (s stage) matches(frame string) bool {
	for _, m := range s.match {
		if strings.Contains(frame, m) {
			return true
		}
	}
	return false
}
