package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/peterbourgon/ff/v3/ffcli"
	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/admin"
	"github.com/airlock-vpn/airlock/internal/capture"
)

// newCaptureCmd is `airlock capture`: a live pcap capture of one job's
// packets through the running gateway's admin socket.
func newCaptureCmd(stdout, stderr io.Writer) *ffcli.Command {
	fs := flag.NewFlagSet("airlock capture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	state := fs.String("state", "", "the gateway's state directory")
	write := fs.String("w", "", "write the pcap stream to this file (created 0600) instead of stdout")
	count := fs.Int("c", 0, "stop after this many packets (default: until interrupted or the job's lease ends)")
	snaplen := fs.Int("s", 0, "keep at most this many bytes of each packet (default: whole packets)")
	buffer := fs.Int("buffer", 0, "the gateway's buffer for this capture in bytes; packets that do not fit are dropped (default 4 MiB)")
	return &ffcli.Command{
		Name:       "capture",
		ShortUsage: "airlock capture --state DIR JOB [-w FILE] [-c N] [FILTER...]",
		ShortHelp:  "capture one job's packets as pcap, like tcpdump on its interface (admin)",
		LongHelp: strings.TrimSpace(`
JOB is a batch job id, lease id or tunnel address (airlock status lists
them). The pcap stream (raw IP, the job's own tunnel address) goes to
stdout, or to -w FILE; e.g.

  airlock capture --state DIR 4242 tcp port 80 | tcpdump -nr -
  airlock capture --state DIR 100.64.0.2 -w job.pcap -c 1000

FILTER is a subset of tcpdump's: tcp, udp, icmp, ip, ip6,
[src|dst] host ADDR, [src|dst] net CIDR, [src|dst] port N,
[src|dst] portrange N-M, combined with and, or, not and parentheses.
Flags may come before or after JOB. Only the gateway's user can use the
admin socket.`),
		FlagSet: fs,
		Exec: func(ctx context.Context, args []string) error {
			// Flags may follow JOB and the filter, as with tcpdump.
			var pos []string
			for len(args) > 0 {
				pos = append(pos, args[0])
				if err := fs.Parse(args[1:]); err != nil {
					return err
				}
				args = fs.Args()
			}
			if len(pos) == 0 {
				return errors.New("capture: no job given; want a batch job id, lease id or tunnel address (airlock status lists them)")
			}
			if *state == "" {
				return errors.New("capture: --state DIR is required (the gateway's state directory)")
			}
			req := admin.CaptureRequest{Job: pos[0], Filter: strings.Join(pos[1:], " "), Snaplen: *snaplen, Buffer: *buffer}
			if _, err := capture.ParseFilter(req.Filter); err != nil {
				return fmt.Errorf("capture: %w", err)
			}
			var out io.Writer = stdout
			if *write != "" && *write != "-" {
				f, err := capture.CreateFile(*write)
				if err != nil {
					return fmt.Errorf("capture: %w", err)
				}
				defer f.Close()
				out = f
			} else if isTerminal(stdout) {
				return errors.New("capture: refusing to write pcap to a terminal: use -w FILE or pipe it, e.g. | tcpdump -nr -")
			}
			c, err := admin.Dial(*state)
			if err != nil {
				if errors.Is(err, admin.ErrNoGateway) {
					return fmt.Errorf("capture: %w: start it, or check --state", err)
				}
				return fmt.Errorf("capture: %w", err)
			}
			defer c.Close()
			ctx, stop := signalContext()
			defer stop()
			body, err := c.Capture(ctx, req)
			if err != nil {
				return err
			}
			defer body.Close()
			n, err := copyRecords(out, body, *count)
			fmt.Fprintf(stderr, "airlock capture: %d packets captured\n", n)
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("capture: %w", err)
			}
			return nil
		},
	}
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
