package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/peterbourgon/ff/v3/ffcli"

	"github.com/airlock-vpn/airlock/internal/admin"
)

func newWhoisCmd(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock whois", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "the gateway's state directory")
	atFlag := fs.String("at", "", "when the connection was seen, RFC 3339 (default: now)")
	asJSON := fs.Bool("json", false, "print the lease records as JSON")
	return &ffcli.Command{
		Name:       "whois",
		ShortUsage: "airlock whois --state DIR [--at RFC3339] PUBLIC_IP:PORT|PUBLIC_IP",
		ShortHelp:  "name the job that held a public address and port at a time",
		LongHelp: `Answers from the gateway's lease history alone (also after restarts and
while the gateway is stopped): which job's port block held PUBLIC_IP:PORT
(IPv6: [ADDR]:PORT). A bare PUBLIC_IP names a job's own public IPv6
address (the gateway's --egress-prefix6), which answers whatever the port.`,
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			if *state == "" {
				return fmt.Errorf("whois: --state DIR is required (the gateway's state directory)")
			}
			if len(args) != 1 {
				for _, a := range args[1:] {
					if strings.HasPrefix(a, "-") {
						return fmt.Errorf("whois: flags go before the address: airlock whois --state DIR [--at RFC3339] PUBLIC_IP:PORT")
					}
				}
				return fmt.Errorf("whois: want one PUBLIC_IP:PORT, got %d arguments", len(args))
			}
			ap, err := parseWhoisAddr(args[0])
			if err != nil {
				return err
			}
			at := time.Now()
			if *atFlag != "" {
				if at, err = time.Parse(time.RFC3339Nano, *atFlag); err != nil {
					return fmt.Errorf("whois: bad --at %q: want RFC 3339, e.g. 2026-11-22T10:00:00Z", *atFlag)
				}
			}
			recs, err := admin.Whois(ctx, *state, ap, at)
			if err != nil {
				return err
			}
			if *asJSON {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(recs)
			}
			if len(recs) == 0 {
				return fmt.Errorf("whois: no lease held %s at %s", ap, at.Format(time.RFC3339))
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "JOB\tBATCH\tUSER\tHOST\tTOKEN\tTUNNEL\tBLOCK\tSTART\tEND")
			for _, r := range recs {
				end := "active"
				if !r.End.IsZero() {
					end = r.End.Format(time.RFC3339) + " (" + human(r.EndReason) + ")"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s:%d-%d\t%s\t%s\n", orDash(r.JobID), orDash(r.BatchSystem),
					orDash(r.User), orDash(r.Host), orDash(r.Token), r.TunnelAddr, r.PublicAddr, r.PortLo, r.PortHi,
					r.Start.Format(time.RFC3339), end)
			}
			return tw.Flush()
		},
	}
}
