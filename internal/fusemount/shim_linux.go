// SPDX-License-Identifier: MIT

package fusemount

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Main must be called first thing in main: run as the mount server or
// as fusermount3/fusermount (the shim), it does that job and exits;
// otherwise it returns at once.
func Main() {
	if os.Getenv(envServerFD) != "" && len(os.Args) > 0 && os.Args[0] == "airlock-fusermount-server" {
		os.Exit(serverMain())
	}
	if len(os.Args) > 0 {
		switch filepath.Base(os.Args[0]) {
		case "fusermount3", "fusermount":
			os.Exit(shim(filepath.Base(os.Args[0]), os.Args[1:], os.Getenv("_FUSE_COMMFD"), os.Stdout, os.Stderr))
		}
	}
}

// shim is fusermount3's command line: [-u [-z]] [-q] [-o OPTS] [--]
// MOUNTPOINT; a mount hands the /dev/fuse descriptor to libfuse over
// the socket commFD names.
func shim(prog string, args []string, commFD string, stdout, stderr io.Writer) int {
	var (
		opts              string
		unmountOp, lazy   bool
		quiet             bool
		mountpoint        string
		seenMountpointArg bool
	)
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "%s: "+format+"\n", append([]any{prog}, a...)...)
		return 1
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			if i+1 < len(args) {
				mountpoint, seenMountpointArg = args[i+1], true
				i = len(args)
			}
		case a == "-h" || a == "--help":
			fmt.Fprintf(stdout, "%s: [options] mountpoint (airlock's stand-in inside airlock run)\n  -o opt[,opt...]  mount options\n  -u               unmount\n  -q               quiet\n  -z               lazy unmount\n", prog)
			return 0
		case a == "-V" || a == "--version":
			fmt.Fprintf(stdout, "%s version: airlock (fusermount3 protocol)\n", prog)
			return 0
		case a == "-o" && i+1 < len(args):
			i++
			if opts != "" {
				opts += ","
			}
			opts += args[i]
		case strings.HasPrefix(a, "-o") && len(a) > 2:
			if opts != "" {
				opts += ","
			}
			opts += a[2:]
		case a == "-u" || a == "--unmount":
			unmountOp = true
		case a == "-z" || a == "--lazy":
			lazy = true
		case a == "-q" || a == "--quiet":
			quiet = true
		case a == "--auto-unmount":
			return fail("--auto-unmount is not supported inside airlock run")
		case strings.HasPrefix(a, "-") && a != "-":
			return fail("unknown option '%s'", a)
		default:
			if seenMountpointArg {
				return fail("extra argument '%s'", a)
			}
			mountpoint, seenMountpointArg = a, true
		}
	}
	if mountpoint == "" {
		return fail("missing mountpoint argument")
	}
	if lazy && !unmountOp {
		return fail("-z can only be used with -u")
	}
	me := caller{uid: os.Getuid(), gid: os.Getgid()}
	if unmountOp {
		path, err := filepath.Abs(mountpoint)
		if err == nil {
			if hasSysAdmin() {
				err = unmountPath(path, lazy, me)
			} else {
				_, err = ask(request{Op: "unmount", Lazy: lazy, Path: path}, -1)
			}
		}
		if err != nil {
			if quiet {
				return 1
			}
			return fail("%s: %v", mountpoint, err)
		}
		return 0
	}
	mp, err := unix.Open(mountpoint, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail("bad mount point %s: %v", mountpoint, err)
	}
	defer func() { unix.Close(mp) }()
	if commFD == "" {
		return fail("old style mounting not supported")
	}
	cfd, err := strconv.Atoi(commFD)
	if err != nil || cfd < 0 {
		return fail("invalid _FUSE_COMMFD: %s", commFD)
	}
	var fd int
	if hasSysAdmin() {
		// A nested user namespace (unshare -Urm): mount here, in the
		// caller's own mount namespace.
		fd, err = mount(mp, opts, me)
	} else {
		fd, err = ask(request{Op: "mount", Opts: opts}, mp)
		mp = -1 // ask closes it
	}
	if err != nil {
		return fail("%v", err)
	}
	defer unix.Close(fd)
	if err := unix.Sendmsg(cfd, []byte{0}, unix.UnixRights(fd), nil, 0); err != nil {
		return fail("sending file descriptor: %v", err)
	}
	return 0
}

// hasSysAdmin reports whether this process has CAP_SYS_ADMIN in its
// user namespace (CapEff in /proc/self/status).
func hasSysAdmin() bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && caps&(1<<unix.CAP_SYS_ADMIN) != 0
		}
	}
	return false
}

// errNoServer means the shim runs where no mount server listens: outside
// airlock run's namespace, or in a container with its own network.
var errNoServer = errors.New("mount failed: Operation not permitted (airlock's fusermount3 server is not reachable from here: outside airlock run's network namespace, e.g. in a container with its own network, mount before starting the container)")

// ask sends req to the server, with the mount point mp attached (-1:
// none), closes mp and returns the descriptor the server sends back (-1
// for none).
func ask(req request, mp int) (int, error) {
	var oob []byte
	if mp >= 0 {
		defer unix.Close(mp)
		oob = unix.UnixRights(mp)
	}
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: socketName, Net: "unixpacket"})
	if err != nil {
		return -1, errNoServer
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(requestTimeout + 2*time.Second))
	b, _ := json.Marshal(req)
	if _, _, err = c.WriteMsgUnix(b, oob, nil); err != nil {
		return -1, fmt.Errorf("ask airlock's fusermount3 server: %w", err)
	}
	buf := make([]byte, maxRequest)
	roob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(buf, roob)
	if err != nil {
		return -1, fmt.Errorf("airlock's fusermount3 server: %w", err)
	}
	fds, err := rights(roob[:oobn])
	if err != nil {
		return -1, err
	}
	var rep reply
	if err := json.Unmarshal(buf[:n], &rep); err != nil {
		closeFDs(fds)
		return -1, fmt.Errorf("airlock's fusermount3 server: %w", err)
	}
	if rep.Err != "" {
		closeFDs(fds)
		return -1, errors.New(rep.Err)
	}
	if req.Op == "mount" && len(fds) != 1 {
		closeFDs(fds)
		return -1, errors.New("airlock's fusermount3 server sent no descriptor")
	}
	if len(fds) == 0 {
		return -1, nil
	}
	return fds[0], nil
}
