// SPDX-License-Identifier: MIT

//go:build !airlock_node

package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/capture"
	"github.com/airlock-vpn/airlock/internal/fleet"
)

// newCaptureCmd is `airlock capture`: a live pcap capture of one job's
// packets through the running gateway's admin socket.
func newCaptureCmd(stdout, stderr io.Writer) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "capture JOB [-w FILE] [-c N] [FILTER...]",
		Short: "capture one job's packets as pcap, like tcpdump on its interface (admin)",
		Long: strings.TrimSpace(`
JOB is a batch job id, lease id or tunnel address (airlock status lists
them). The pcap stream (raw IP, the job's own tunnel address) goes to
stdout, or to -w FILE.

FILTER is a subset of tcpdump's: tcp, udp, icmp, ip, ip6,
[src|dst] host ADDR, [src|dst] net CIDR, [src|dst] port N,
[src|dst] portrange N-M, combined with and, or, not and parentheses.
Flags may come before or after JOB. Only the gateway's user can use the
admin socket.

In a fleet, a JOB that another gateway holds is captured there and relayed
through the fleet: asked with --state on any gateway, or with --store on an
admin host that reaches the holding gateway's control port. The relay is
authorized by a single-use ticket in the fleet's database, not by anything
a network peer can present (docs/fleet.md).`),
		Example: `  airlock capture 4242 tcp port 80 | tcpdump -nr -
  airlock capture 100.64.0.2 -w job.pcap -c 1000`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("no job given; want a batch job id, lease id or tunnel address (airlock status lists them)")
			}
			return nil
		},
	}
	var o captureOpts
	stateFlag(cmd, &o.state)
	fs := cmd.Flags()
	fs.StringVarP(&o.write, "write", "w", "", "write the pcap stream to this `FILE` (a new file, created 0600; an existing file is refused) instead of stdout")
	fs.IntVarP(&o.count, "count", "c", 0, "stop after this many packets (default: until interrupted or the job's lease ends)")
	fs.IntVarP(&o.snaplen, "snaplen", "s", 0, "keep at most this many bytes of each packet (default: whole packets)")
	fs.IntVar(&o.buffer, "buffer", 0, "the gateway's buffer for this capture in bytes; packets that do not fit are dropped (default 4 MiB)")
	_ = cmd.MarkFlagFilename("write", "pcap")
	storeFlags(cmd, &o.so, "; instead of --state, on an admin host: the capture is relayed from the fleet's gateway that holds JOB")
	cmd.RunE = func(cmd *cobra.Command, pos []string) error {
		return runCapture(stdout, stderr, o, useStore(cmd, o.so), pos[0], strings.Join(pos[1:], " "))
	}
	return cmd
}

// captureOpts are airlock capture's flags.
type captureOpts struct {
	state                  string
	so                     storeOpts
	write                  string
	count, snaplen, buffer int
}

// runCapture captures the packets of job selected by filter, through the
// fleet (fromStore) or the gateway's admin socket, to stdout or o.write,
// until o.count packets, the job's end or a signal.
func runCapture(stdout, stderr io.Writer, o captureOpts, fromStore bool, job, filter string) error {
	if !fromStore {
		if err := needState(o.state); err != nil {
			return err
		}
	}
	req := admin.CaptureRequest{Job: job, Filter: filter, Snaplen: o.snaplen, Buffer: o.buffer}
	if _, err := admin.CheckCapture(req); err != nil {
		return err
	}
	var out io.Writer = stdout
	toFile := o.write != "" && o.write != "-"
	if toFile {
		if err := capture.CheckNewFile(o.write); err != nil {
			return fmt.Errorf("capture: %w", err)
		}
	} else if isTerminal(stdout) {
		return errors.New("capture: refusing to write pcap to a terminal: use -w FILE or pipe it, e.g. | tcpdump -nr -")
	}
	ctx, stop := signalContext()
	defer stop()
	body, err := startCapture(ctx, stderr, fromStore, o.so, o.state, req)
	if err != nil {
		return err
	}
	defer body.Close()
	if toFile {
		// Made once the gateway took the capture: a refused one
		// leaves no empty file behind.
		f, err := capture.CreateFile(o.write)
		if err != nil {
			return fmt.Errorf("capture: %w", err)
		}
		defer f.Close()
		out = f
	}
	n, err := copyRecords(out, body, o.count)
	fmt.Fprintf(stderr, "airlock capture: %d packets captured\n", n)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("capture: %w", err)
	}
	return nil
}

// startCapture starts the capture req: relayed from the fleet's gateway
// that holds the job (fromStore), or through the admin socket of the
// gateway of state directory state. Closing the stream it returns ends the
// capture and the connection it came by.
func startCapture(ctx context.Context, stderr io.Writer, fromStore bool, so storeOpts, state string, req admin.CaptureRequest) (io.ReadCloser, error) {
	if !fromStore {
		c, err := dialAdmin("capture", state)
		if err != nil {
			return nil, err
		}
		body, err := c.Capture(ctx, req)
		if err != nil {
			c.Close()
			return nil, err
		}
		return closeBoth{body, c}, nil
	}
	db, err := so.open(ctx)
	if err != nil {
		return nil, err
	}
	body, _, gw, err := fleet.Capture(ctx, db, fleet.CaptureRequest{Job: req.Job, Filter: req.Filter, Snaplen: req.Snaplen,
		Buffer: req.Buffer, By: adminHostBy("airlock capture --store")}, fleetCaptureTimeout)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("capture %s: %w", req.Job, err)
	}
	fmt.Fprintf(stderr, "airlock capture: relayed from gateway %s\n", human(gw.Advertise))
	return closeBoth{body, db}, nil
}

// closeBoth is a stream that closes what it came by after itself.
type closeBoth struct {
	io.ReadCloser
	by io.Closer
}

func (c closeBoth) Close() error {
	err := c.ReadCloser.Close()
	c.by.Close()
	return err
}

// fleetCaptureTimeout bounds the connection to the gateway that holds a
// job captured with --store and the wait for its answer.
const fleetCaptureTimeout = 10 * time.Second

// adminHostBy says who runs what on an admin host, as the holding gateway
// logs it: the user and host as this host names them (claimed, not
// attested).
func adminHostBy(what string) string {
	host, _ := os.Hostname()
	name := strconv.Itoa(os.Getuid())
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	return fmt.Sprintf("%s by user %s on host %s (as they claim)", what, name, host)
}

// copyRecords copies a pcap stream from r to w record by record, at most
// max records (0: all), and returns how many it copied.
func copyRecords(w io.Writer, r io.Reader, max int) (int, error) {
	hdr := make([]byte, 24)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, fmt.Errorf("read pcap header: %w", err)
	}
	if _, err := w.Write(hdr); err != nil {
		return 0, err
	}
	buf := make([]byte, 16+capture.DefaultSnaplen)
	for n := 0; max == 0 || n < max; n++ {
		if _, err := io.ReadFull(r, buf[:16]); err != nil {
			if errors.Is(err, io.EOF) {
				return n, nil
			}
			return n, err
		}
		capLen := int(binary.LittleEndian.Uint32(buf[8:12]))
		if capLen > capture.DefaultSnaplen {
			return n, fmt.Errorf("bad pcap record of %d bytes", capLen)
		}
		if _, err := io.ReadFull(r, buf[16:16+capLen]); err != nil {
			return n, err
		}
		if _, err := w.Write(buf[:16+capLen]); err != nil {
			return n, err
		}
	}
	return max, nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
