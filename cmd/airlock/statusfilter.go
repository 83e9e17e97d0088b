// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"text/tabwriter"

	"github.com/airlock-vpn/airlock/internal/admin"
)

// A gateway may hold 10,000 jobs: airlock status then prints a summary by
// token, user and node rather than a line per job, and lists jobs only
// when they are few (maxListed), when filters (--token, --user, --node)
// narrow them down to few, or with --all.

// maxListed is how many jobs airlock status lists without --all.
const maxListed = 50

// summaryRows is how many tokens, users and nodes the summary shows.
const summaryRows = 10

// jobFilter selects jobs by token name, user and node; an empty field
// matches every job.
type jobFilter struct{ token, user, node string }

func (f jobFilter) empty() bool { return f == jobFilter{} }

// jobUser is the job's user for filters and summaries: the attested one
// where there is one, else the claimed one, else its uid.
func jobUser(j admin.JobStatus) string {
	if a := j.Attested; a != nil {
		return cmp.Or(a.User, "uid "+strconv.FormatUint(uint64(a.UID), 10))
	}
	return cmp.Or(j.User, "uid "+strconv.Itoa(j.ClaimedUID))
}

// jobNode is the job's node: the node the batch system attested, else the
// host the client claimed.
func jobNode(j admin.JobStatus) string {
	if a := j.Attested; a != nil && a.Job != nil && a.Job.Node != "" {
		return a.Job.Node
	}
	return j.Host
}

func (f jobFilter) match(j admin.JobStatus) bool {
	u := jobUser(j)
	return (f.token == "" || j.Token == f.token) &&
		(f.user == "" || u == f.user || j.User == f.user) &&
		(f.node == "" || jobNode(j) == f.node || j.Host == f.node)
}

// filterJobs returns the jobs of st that f matches.
func filterJobs(jobs []admin.JobStatus, f jobFilter) []admin.JobStatus {
	if f.empty() {
		return jobs
	}
	var out []admin.JobStatus
	for _, j := range jobs {
		if f.match(j) {
			out = append(out, j)
		}
	}
	return out
}

// groupStats is one row of the summary.
type groupStats struct {
	name             string
	jobs, flows      int
	rateOut, rateIn  float64
	bytesOut, bytesI uint64
}

// summarize groups jobs by key, largest groups first, at most n.
func summarize(jobs []admin.JobStatus, key func(admin.JobStatus) string, n int) (rows []groupStats, more int) {
	by := map[string]*groupStats{}
	for _, j := range jobs {
		k := key(j)
		g := by[k]
		if g == nil {
			g = &groupStats{name: k}
			by[k] = g
		}
		g.jobs++
		g.flows += j.ActiveFlows
		g.rateOut += j.RateOut
		g.rateIn += j.RateIn
		g.bytesOut += j.BytesOut
		g.bytesI += j.BytesIn
	}
	for _, g := range by {
		rows = append(rows, *g)
	}
	slices.SortFunc(rows, func(a, b groupStats) int {
		return cmp.Or(cmp.Compare(b.jobs, a.jobs), cmp.Compare(a.name, b.name))
	})
	if len(rows) > n {
		return rows[:n], len(rows) - n
	}
	return rows, 0
}

// printSummary prints the jobs' summary by token, user and node.
func printSummary(w io.Writer, jobs []admin.JobStatus) error {
	for _, s := range []struct {
		title string
		key   func(admin.JobStatus) string
	}{
		{"TOKEN", func(j admin.JobStatus) string { return j.Token }},
		{"USER", jobUser},
		{"NODE", jobNode},
	} {
		rows, more := summarize(jobs, s.key, summaryRows)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tJOBS\tFLOWS\tRATE OUT\tRATE IN\tBYTES OUT\tBYTES IN\n", s.title)
		for _, g := range rows {
			fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\t%s\t%s\n", orDash(g.name), g.jobs, g.flows,
				humanRate(g.rateOut), humanRate(g.rateIn), humanBytes(g.bytesOut), humanBytes(g.bytesI))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if more > 0 {
			fmt.Fprintf(w, "(and %d more)\n", more)
		}
		fmt.Fprintln(w)
	}
	return nil
}
