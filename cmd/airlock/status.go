// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/flows"
	"github.com/airlock-vpn/airlock/internal/tunnel"
)

// dialAdmin connects to the running gateway of state.
func dialAdmin(cmd, state string) (*admin.Client, error) {
	if err := needState(state); err != nil {
		return nil, err
	}
	c, err := admin.Dial(state)
	if errors.Is(err, admin.ErrNoGateway) {
		return nil, fmt.Errorf("%s: %w: start it with airlock gateway --state %s", cmd, err, state)
	}
	return c, err
}

func newStatusCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "status",
		Short: "show the running gateway: mode, uptime, jobs, rates, flows, bytes; with --fleet every gateway of its fleet",
		Long: `Shows the running gateway of --state: its mode, egress, capacity, flows and
traffic, and its jobs. Up to 50 jobs are listed one per line; more are
summarized by token, user and node (the ten largest of each) instead, and
--token, --user and --node select jobs (and with --json, the jobs
printed); --all lists every job.`,
		Example: `  airlock status
  airlock status --token cms-pilots --node wn042
  airlock status --fleet --store 'postgres://airlock_gateway@db.example.org/airlock?sslmode=verify-full&sslrootcert=/etc/airlock/db-ca.pem'`,
		Args: noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	asJSON := jsonFlag(cmd, "the status")
	fleetView := cmd.Flags().Bool("fleet", false, "every gateway of the fleet (address, state, jobs, capacity, version, heartbeat) and every live job, from the shared database: through the gateway of --state, or with --store on an admin host")
	var so storeOpts
	storeFlags(cmd, &so, "; with --fleet, instead of --state")
	var f jobFilter
	cmd.Flags().StringVar(&f.token, "token", "", "only jobs that joined with the token of this `NAME`")
	cmd.Flags().StringVar(&f.user, "user", "", "only jobs of this user (`NAME`, or \"uid N\"; attested where it is)")
	cmd.Flags().StringVar(&f.node, "node", "", "only jobs on this node (`NAME`: the batch system's node name, else the host the client gave)")
	all := cmd.Flags().Bool("all", false, fmt.Sprintf("list every job, however many (default: at most %d, else a summary by token, user and node)", maxListed))
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if *fleetView {
			if !useStore(cmd, so) {
				so = storeOpts{}
			}
			st, err := fleetStatus(cmd.Context(), state, so)
			if err != nil {
				return err
			}
			if *asJSON {
				return printJSON(stdout, st)
			}
			return printFleetStatus(stdout, st)
		}
		c, err := dialAdmin("status", state)
		if err != nil {
			return err
		}
		defer c.Close()
		st, err := c.Status(cmd.Context())
		if err != nil {
			return err
		}
		if *asJSON {
			st.Jobs = filterJobs(st.Jobs, f)
			return printJSON(stdout, st)
		}
		return printStatus(stdout, st, f, *all)
	}
	return cmd
}

// printStatus prints st, its jobs that f matches one per line if they are
// few or all is set, else their summary.
func printStatus(w io.Writer, st admin.Status, f jobFilter, all bool) error {
	printGatewayStatus(w, st)
	jobs := filterJobs(st.Jobs, f)
	if f.empty() {
		fmt.Fprintf(w, "jobs:       %d\n", len(st.Jobs))
	} else {
		fmt.Fprintf(w, "jobs:       %d, %d of them selected\n", len(st.Jobs), len(jobs))
	}
	if len(jobs) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	if len(jobs) > maxListed && !all {
		if err := printSummary(w, jobs); err != nil {
			return err
		}
		fmt.Fprintf(w, "%d jobs are too many to list one by one: select some with --token, --user or --node, or list them all with --all\n", len(jobs))
		return nil
	}
	return printJobs(w, jobs, st.PortBlocks.Addrs > 1)
}

// printGatewayStatus prints the gateway's lines of status: mode, egress,
// key, capacity, sockets, drain, flows and traffic totals.
func printGatewayStatus(w io.Writer, st admin.Status) {
	up := time.Duration(st.UptimeSeconds * float64(time.Second)).Round(time.Second)
	fmt.Fprintf(w, "gateway:    %s mode, up %s (since %s), clients dial %s, version %s\n", st.Mode, up, st.Started.Format(time.RFC3339), st.Advertise, orDash(st.Version))
	fmt.Fprintf(w, "egress:     %s, port blocks %d of %d in use, %d free (%s, %d ports each)\n", st.EgressAddr, st.PortBlocks.Used, st.PortBlocks.Total, st.PortBlocks.Free, st.PortBlocks.Range, st.PortBlocks.Size)
	if st.NextPin != "" {
		fmt.Fprintf(w, "key:        rotation under way: pin %s, next %s (airlock gateway rotate-key --finish ends it)\n", st.Pin, st.NextPin)
	} else if st.Pin != "" {
		fmt.Fprintf(w, "key:        pin %s\n", st.Pin)
	}
	if c := st.Capacity; c.Jobs > 0 {
		fmt.Fprintf(w, "capacity:   %d concurrent jobs, bound by %s (%s)\n", c.Jobs, c.Bound, c.Hint)
	}
	if u := st.UDP; u.Sockets > 0 {
		fmt.Fprintf(w, "udp:        %d receive drops, buffers %s receive, %s send%s\n", u.ReceiveDrops, humanBytes(uint64(u.ReceiveBuffer)), humanBytes(uint64(u.SendBuffer)), smallBuffers(u))
	}
	if st.Draining {
		fmt.Fprintf(w, "draining:   new joins refused, running jobs continue (airlock gateway drain --undo ends it)\n")
	}
	t := st.Totals
	fmt.Fprintf(w, "flows:      %d active, %d since start%s\n", t.ActiveFlows, t.Flows, refusals(t.Verdicts))
	fmt.Fprintf(w, "traffic:    out %s (%d packets), in %s (%d packets)\n", humanBytes(t.BytesOut), t.PacketsOut, humanBytes(t.BytesIn), t.PacketsIn)
	for _, b := range t.Bulk {
		fmt.Fprintf(w, "bulk:       %s: %d flows, out %s, in %s\n", b.Rule, b.Flows, humanBytes(b.BytesOut), humanBytes(b.BytesIn))
	}
	for _, b := range t.Bypass {
		fmt.Fprintf(w, "bypass:     %s: %d flows, out %s, in %s (reported by jobs' clients, not through the gateway)\n", b.Rule, b.Flows, humanBytes(b.BytesOut), humanBytes(b.BytesIn))
	}
	if t.LogErrors > 0 {
		fmt.Fprintf(w, "flow log:   %d records could not be written: see the gateway's log\n", t.LogErrors)
	}
}

// printJobs prints jobs one a line; pool (an egress pool of several
// addresses) adds the public address to each job's ports.
func printJobs(w io.Writer, jobs []admin.JobStatus, pool bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tLEASE\tADDRESS\tPORTS\tTOKEN\tIDENTITY\tUSER@HOST\tRATE OUT\tRATE IN\tFLOWS\tBYTES OUT\tBYTES IN\tSINCE")
	for _, j := range jobs {
		who := userCell(j.User, j.ClaimedUID, j.Attested) + " @ " + hostCell(j.Host, j.Attested)
		if pool && j.PublicAddr.IsValid() && j.Ports != "" {
			j.Ports = j.PublicAddr.String() + ":" + j.Ports // an egress pool: which address
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\t%s\n",
			jobCell(j.JobID, j.Attested), j.Lease, j.Addr, orDash(j.Ports), orDash(j.Token), identityCell(j.Issued), who,
			humanRate(j.RateOut), humanRate(j.RateIn), j.ActiveFlows, j.Flows,
			humanBytes(j.BytesOut), humanBytes(j.BytesIn), j.Started.Format(time.RFC3339))
	}
	return tw.Flush()
}

// refusals formats the non-allowed verdict counts.
func refusals(v map[string]uint64) string {
	var parts []string
	for k, n := range v {
		if k != flows.Allowed && n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return ""
	}
	sort.Strings(parts)
	return "; " + strings.Join(parts, ", ")
}

func newFlowsCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "flows [--job ID] [--active]",
		Short: "list the gateway's flows: open ones and the most recent ended ones",
		Long: `Every flow of every job: 5-tuple, job, token, direction, bytes and packets
each way, start, end and verdict. The full history is the flow log
(STATE/flows.log, JSON lines); this shows open flows and the last 1024
ended or refused ones.`,
		Args: noArgs,
	}
	var state string
	stateFlag(cmd, &state)
	job := cmd.Flags().String("job", "", "only the flows of this batch job id, lease id or tunnel address")
	active := cmd.Flags().Bool("active", false, "only open flows (default: open ones, then the most recent ended and refused ones)")
	asJSON := jsonFlag(cmd, "the flows")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		c, err := dialAdmin("flows", state)
		if err != nil {
			return err
		}
		defer c.Close()
		fl, err := c.Flows(ctx, *job, *active)
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, fl)
		}
		recs := append(fl.Active, fl.Recent...)
		if len(recs) == 0 {
			fmt.Fprintln(stdout, "no flows")
			return nil
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPROTO\tDIR\tSOURCE\tDESTINATION\tJOB\tTOKEN\tBYTES OUT\tBYTES IN\tPKTS OUT\tPKTS IN\tSTART\tSTATE\tVERDICT")
		for _, r := range recs {
			state := "active"
			if !r.End.IsZero() {
				state = r.EndReason
				if state == "" {
					state = "ended"
				}
			}
			if r.Bypass != "" {
				state += " bypass"
			}
			if r.Bulk != "" {
				state += " bulk"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n",
				r.ID, r.Proto, r.Direction, r.Src, r.Dst, orDash(r.JobID), orDash(r.Token),
				humanBytes(r.BytesOut), humanBytes(r.BytesIn), r.PacketsOut, r.PacketsIn,
				r.Start.Format("15:04:05"), state, r.Verdict)
		}
		return tw.Flush()
	}
	return cmd
}

func newKickCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kick [--reason TEXT] [--ban DURATION] JOB",
		Short: "end a job's lease now (JOB: lease id, tunnel address or batch job id)",
		Long: `Ends the lease of JOB at once: its tunnel and flows are cut and its port
block is freed. JOB is a lease id, a tunnel address or a batch job id; batch
job ids come from the jobs themselves, so when several live leases claim
the same one the kick is refused and lists them, to be kicked by lease id
or address. The job's airlock run is told at once over its lease watch and
prints a message saying the gateway's admin ended the lease, with --reason.
With --ban, for that long (kept in the state database; in a fleet, on
every gateway), a ban covers what the gateway knows of the job:
  - a job identified by a bearer token its issuer signed ([[issuer]]):
    every join of that issuer's subject, with any token or join token,
    from any node; its other running jobs end;
  - a job whose uid was attested (MUNGE): every join of that uid, with any
    token or with none, from any node; and joins from the job's node (its
    address) that carry no attested identity and use the job's token or
    claim its uid. Other users of that node, whose joins are attested, are
    not banned. Every other running job of that uid ends, and the
    unattested jobs from that node of that token or claiming that uid;
  - any other job: joins of the job's token from its host name or its
    network (its IPv4 address, or its IPv6 /64), and its other jobs of
    that token from there end. In a fleet, a JOB that another gateway holds is
ended by that gateway; with --store on an admin host, by whichever holds
it.`,
		Args: exactArgs(1, "one JOB (batch job id, lease id or tunnel address)"),
	}
	var state string
	stateFlag(cmd, &state)
	reason := cmd.Flags().String("reason", "", "why, for the job's user (shown by its airlock run) and the lease history")
	ban := cmd.Flags().Duration("ban", 0, "also refuse new joins for this long, e.g. 24h: of the job's issuer-verified subject, else of its attested uid with any token or none, else of its token from its host (see above)")
	asJSON := jsonFlag(cmd, "the ended leases")
	var so storeOpts
	storeFlags(cmd, &so, "; instead of --state, on an admin host: the fleet's gateway that holds JOB ends it")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		ctx := cmd.Context()
		if *ban < 0 {
			return usagef("--ban %v: want a positive duration", *ban)
		}
		var res admin.KickResult
		var err error
		if useStore(cmd, so) {
			res, err = storeKick(ctx, so, args[0], *reason, *ban)
		} else {
			res, err = adminKick(ctx, state, args[0], *reason, *ban)
		}
		if err != nil {
			return err
		}
		if *asJSON {
			return printJSON(stdout, res)
		}
		printKicked(stdout, res)
		return nil
	}
	return cmd
}

// adminKick asks the gateway of state directory state to end job's lease,
// and ban it for ban if not 0.
func adminKick(ctx context.Context, state, job, reason string, ban time.Duration) (admin.KickResult, error) {
	c, err := dialAdmin("kick", state)
	if err != nil {
		return admin.KickResult{}, err
	}
	defer c.Close()
	req := admin.KickRequest{Job: job, Reason: reason}
	if ban > 0 {
		req.Ban = ban.String()
	}
	return c.Kick(ctx, req)
}

// printKicked prints the leases a kick ended, and the ban.
func printKicked(w io.Writer, res admin.KickResult) {
	for _, k := range res.Kicked {
		fmt.Fprintf(w, "ended lease %s of job %s at %s\n", k.Lease, orDash(human(k.JobID)), k.Addr)
		if k.Gateway != "" {
			fmt.Fprintf(w, "  on gateway %s of the fleet\n", human(k.Gateway))
		}
		if !res.BannedUntil.IsZero() {
			fmt.Fprintf(w, "banned until %s: %s\n", res.BannedUntil.Format(time.RFC3339), human(res.BanCovers))
		}
	}
}

// humanBytes formats a byte count with IEC units.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// humanRate formats bits per second.
func humanRate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f Gbit/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f Mbit/s", bps/1e6)
	case bps >= 1e3:
		return fmt.Sprintf("%.1f kbit/s", bps/1e3)
	}
	return fmt.Sprintf("%.0f bit/s", bps)
}

// smallBuffers is the fix when the gateway's UDP buffers are below what it
// asks for (tunnel.SocketBufferSize), else "".
func smallBuffers(u admin.UDPStats) string {
	if u.ReceiveBuffer >= tunnel.SocketBufferSize && u.SendBuffer >= tunnel.SocketBufferSize {
		return ""
	}
	return fmt.Sprintf(" (asked for %s: sysctl -w net.core.rmem_max=%d net.core.wmem_max=%d)", humanBytes(tunnel.SocketBufferSize), tunnel.SocketBufferSize, tunnel.SocketBufferSize)
}
