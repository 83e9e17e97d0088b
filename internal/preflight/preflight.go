// SPDX-License-Identifier: MIT

// Package preflight checks, before the first job fails, that a compute
// node or a gateway host has what Airlock needs: user namespaces,
// /dev/net/tun, ping sockets, the local port range against the port
// blocks, the open-file limit, and from a node the gateway's TCP and UDP
// ports and its pin. `airlock run --check` and `airlock gateway --check`
// print its reports.
//
// Every check returns one Result: OK, Warn (works, degraded: a fallback
// applies) or Problem (a job or the gateway will fail), with a fix an admin
// can act on. Checks read the host through a Host, whose fields tests
// replace; none changes the host.
package preflight

import (
	"fmt"
	"io"
	"strings"
)

// Status is a check's verdict.
type Status int

// Verdicts, from good to bad.
const (
	OK Status = iota
	Warn
	Problem
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	default:
		return "PROBLEM"
	}
}

// Result is one check's outcome.
type Result struct {
	// Name says what was checked, e.g. "/dev/net/tun".
	Name   string
	Status Status
	// Detail is what was found.
	Detail string
	// Fix says what to do; empty when Status is OK.
	Fix string
}

// Report is the results of a preflight run, in order.
type Report []Result

// Failed reports whether any result is a Problem.
func (r Report) Failed() bool {
	for _, res := range r {
		if res.Status == Problem {
			return true
		}
	}
	return false
}

// Write prints one line per result ("ok      NAME: DETAIL"), a "fix:" line
// under each warning and problem, and a summary line.
func (r Report) Write(w io.Writer) error {
	var b strings.Builder
	n := [3]int{}
	for _, res := range r {
		n[res.Status]++
		fmt.Fprintf(&b, "%-7s %s: %s\n", res.Status, res.Name, oneLine(res.Detail))
		if res.Status != OK && res.Fix != "" {
			fmt.Fprintf(&b, "        fix: %s\n", oneLine(res.Fix))
		}
	}
	fmt.Fprintf(&b, "%d ok, %d warnings, %d problems\n", n[OK], n[Warn], n[Problem])
	_, err := io.WriteString(w, b.String())
	return err
}

// oneLine keeps a detail on one line and free of control characters (it
// may quote text from the network, e.g. an error from the gateway).
func oneLine(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
}
