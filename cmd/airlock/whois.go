// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/store"
	"github.com/airlock-vpn/airlock/internal/store/pgstore"
)

func newWhoisCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "whois [--at RFC3339] PUBLIC_IP:PORT|PUBLIC_IP",
		Short: "name the job that held a public address and port at a time",
		Long: `Answers from the gateway's lease history alone (also after restarts and
while the gateway is stopped): which job's port block held PUBLIC_IP:PORT
(IPv6: [ADDR]:PORT). A bare PUBLIC_IP names a job's own public IPv6
address (the gateway's --egress-prefix), which answers whatever the port.
Exits 1 when no lease held the address, with --json too (which then prints
an empty list).`,
		Example: `  airlock whois 203.0.113.1:20311 --at 2026-11-22T10:00:00Z
  airlock whois '[2001:db8::1]:20311' --json`,
		Args: exactArgs(1, "one PUBLIC_IP:PORT"),
	}
	var state string
	stateFlag(cmd, &state)
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: every gateway's history")
	atFlag := cmd.Flags().String("at", "", "when the connection was seen, RFC 3339 (default: now)")
	asJSON := jsonFlag(cmd, "the lease records")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		if err := needState(state); err != nil && !useStore(cmd, so) {
			return err
		}
		ap, err := parseWhoisAddr(args[0])
		if err != nil {
			return err
		}
		at := time.Now()
		if *atFlag != "" {
			if at, err = time.Parse(time.RFC3339Nano, *atFlag); err != nil {
				return usagef("bad --at %q: want RFC 3339, e.g. 2026-11-22T10:00:00Z", truncateArg(*atFlag))
			}
		}
		recs, err := whoisRecords(ctx, useStore(cmd, so), so, state, ap, at)
		if err != nil {
			return err
		}
		if *asJSON {
			if recs == nil {
				recs = []store.LeaseRecord{}
			}
			if err := printJSON(stdout, recs); err != nil {
				return err
			}
		}
		if len(recs) == 0 {
			return fmt.Errorf("whois: no lease held %s at %s", ap, at.Format(time.RFC3339))
		}
		if *asJSON {
			return nil
		}
		return printWhois(stdout, recs, ap.Addr())
	}
	return cmd
}

// whoisRecords returns the lease records that held ap at at: from the
// fleet's database (fromStore) or the state directory's history.
func whoisRecords(ctx context.Context, fromStore bool, so storeOpts, state string, ap netip.AddrPort, at time.Time) ([]store.LeaseRecord, error) {
	if !fromStore {
		return admin.Whois(ctx, state, ap, at)
	}
	var recs []store.LeaseRecord
	err := withStoreDB(ctx, so, func(db *pgstore.Store) error {
		var err error
		recs, err = db.Whois(ap.Addr(), ap.Port(), at)
		return err
	})
	return recs, err
}

// printWhois prints the lease records recs that held public address addr,
// one a line.
func printWhois(w io.Writer, recs []store.LeaseRecord, addr netip.Addr) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tBATCH\tUSER\tHOST\tTOKEN\tIDENTITY\tGATEWAY\tTUNNEL\tBLOCK\tSTART\tEND")
	// Identity columns say where each value comes from: (munge) is
	// attested, (claimed) is what the job's client said.
	for _, r := range recs {
		end := "active"
		if !r.End.IsZero() {
			end = r.End.Format(time.RFC3339) + " (" + human(r.EndReason) + ")"
		}
		a, _ := r.AttributionAt(addr)
		batch := r.BatchSystem
		if r.Attested != nil && r.Attested.Job != nil {
			batch = r.Attested.Job.BatchSystem
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", jobCell(r.JobID, r.Attested), orDash(batch),
			userCell(r.User, r.UID, r.Attested), hostCell(r.Host, r.Attested), orDash(r.Token), identityCell(r.Issued), orDash(human(r.Gateway)), r.TunnelAddr(), a,
			r.Start.Format(time.RFC3339), end)
	}
	return tw.Flush()
}

// parseWhoisAddr parses whois's argument: IP:PORT, [IPV6]:PORT, or a bare
// IP (port 0), which finds jobs' own public IPv6 addresses by address
// alone.
func parseWhoisAddr(s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
	}
	if a, err := netip.ParseAddr(s); err == nil && a.Zone() == "" {
		return netip.AddrPortFrom(a.Unmap(), 0), nil
	}
	return netip.AddrPort{}, fmt.Errorf("whois: bad address %q: want IP:PORT, e.g. 203.0.113.1:20311 or [2001:db8::1]:20311, or a bare IP for a job's own IPv6 address", truncateArg(s))
}
