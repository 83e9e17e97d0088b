// SPDX-License-Identifier: MIT

package fusemount

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// socketName is the server's abstract unix socket in the job's (private)
// network namespace.
const socketName = "@airlock-fusermount"

// envServerFD names the listener's descriptor in the server process;
// envServerParent the pid of airlock run, its parent (CLONE_PARENT).
const (
	envServerFD     = "AIRLOCK_FUSE_SERVER_FD"
	envServerParent = "AIRLOCK_FUSE_SERVER_PARENT"
)

// Limits of the server: concurrent requests, and how long one may take.
const (
	maxConcurrent  = 8
	requestTimeout = 10 * time.Second
	maxRequest     = 4096
)

// Binaries the shim stands in for, where the node has them.
var fusermounts = []string{"/usr/bin/fusermount3", "/usr/bin/fusermount", "/bin/fusermount3", "/bin/fusermount"}

// ErrNoDevice means /dev/fuse cannot be opened here: FUSE cannot work in
// the job whatever airlock does.
var ErrNoDevice = errors.New("/dev/fuse cannot be opened")

// request is the shim's message to the server, with the mount point's
// O_PATH descriptor attached.
type request struct {
	Op   string `json:"op"` // "mount" or "unmount"
	Opts string `json:"opts,omitempty"`
	Lazy bool   `json:"lazy,omitempty"`
	// Path is the absolute mount point to unmount (no descriptor: one
	// would keep the mount busy).
	Path string `json:"path,omitempty"`
}

// reply is the server's answer; a mount's /dev/fuse descriptor is attached.
type reply struct {
	Err string `json:"err,omitempty"`
}

// Setup readies fusermount3 for the job; the namespace child calls it
// with CAP_SYS_ADMIN of the job's user namespace (ambient), in the job's
// mount and network namespaces, before it execs the job. It bind-mounts
// this binary over the node's fusermount3 and fusermount and starts the
// mount server (see the package comment). An error means fusermount3 will
// fail in the job as it would without Setup; the job can still run.
func Setup() error {
	fd, err := unix.Open(fuseDev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrNoDevice, err)
	}
	unix.Close(fd)
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("fusermount3 shim: %w", err)
	}
	done := map[string]bool{}
	for _, p := range fusermounts {
		real, err := filepath.EvalSymlinks(p)
		if err != nil || done[real] {
			continue
		}
		done[real] = true
		if err := unix.Mount(self, real, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind the fusermount3 shim over %s: %w", real, err)
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: socketName, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("fusermount3 server: listen: %w", err)
	}
	defer ln.Close()
	f, err := ln.File()
	if err != nil {
		return fmt.Errorf("fusermount3 server: %w", err)
	}
	defer f.Close()
	cmd := exec.Command(self)
	cmd.Args = []string{"airlock-fusermount-server"}
	cmd.Env = []string{envServerFD + "=3", envServerParent + "=" + strconv.Itoa(os.Getppid())}
	cmd.ExtraFiles = []*os.File{f}
	// A sibling of the job, not its child (CLONE_PARENT). It is in the
	// job's network namespace, so the job's cleanup kills it with the
	// rest, and it asks for SIGKILL when airlock run dies (serverMain:
	// Pdeathsig here would make os/exec's child kill itself at once, as
	// its parent is not the process that forked it).
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: unix.CLONE_PARENT}
	errc := make(chan error, 1)
	go func() {
		// The server keeps CAP_SYS_ADMIN only: lower the ambient
		// CAP_NET_ADMIN on this thread, which forks it and is then
		// discarded (never unlocked).
		runtime.LockOSThread()
		if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_LOWER, unix.CAP_NET_ADMIN, 0, 0); err != nil {
			errc <- fmt.Errorf("fusermount3 server: lower CAP_NET_ADMIN: %w", err)
			return
		}
		errc <- cmd.Start()
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("fusermount3 server: %w", err)
	}
	_ = cmd.Process.Release() // not our child (CLONE_PARENT)
	return nil
}

// serverMain is the mount server's life: serve the listener it inherited
// until killed.
func serverMain() int {
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return 1
	}
	if strconv.Itoa(os.Getppid()) != os.Getenv(envServerParent) {
		return 1 // airlock run died before the death signal was armed
	}
	f := os.NewFile(3, "fusermount3 listener")
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		return 1
	}
	ln, ok := l.(*net.UnixListener)
	if !ok {
		return 1
	}
	sem := make(chan struct{}, maxConcurrent)
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return 0
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			defer c.Close()
			serve(c)
		}()
	}
}

// serve answers one request on c.
func serve(c *net.UnixConn) {
	c.SetDeadline(time.Now().Add(requestTimeout))
	req, fds, err := readMsg(c)
	defer closeFDs(fds)
	var rep reply
	var out []int
	switch {
	case err != nil:
		rep.Err = err.Error()
	case req.Op == "mount" && len(fds) != 1, req.Op != "mount" && len(fds) != 0:
		rep.Err = "want one mount point descriptor to mount, none to unmount"
	default:
		who, err := peer(c)
		if err != nil {
			rep.Err = err.Error()
			break
		}
		switch req.Op {
		case "mount":
			fd, err := mount(fds[0], req.Opts, who)
			if err != nil {
				rep.Err = err.Error()
			} else {
				out = []int{fd}
				defer unix.Close(fd)
			}
		case "unmount":
			if !filepath.IsAbs(req.Path) {
				rep.Err = "want an absolute mount point"
			} else if err := unmountPath(req.Path, req.Lazy, who); err != nil {
				rep.Err = err.Error()
			}
		default:
			rep.Err = fmt.Sprintf("unknown request %q", req.Op)
		}
	}
	b, _ := json.Marshal(rep)
	var oob []byte
	if len(out) > 0 {
		oob = unix.UnixRights(out...)
	}
	c.WriteMsgUnix(b, oob, nil)
}

// peer is the connected process's uid and gid (SO_PEERCRED).
func peer(c *net.UnixConn) (caller, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return caller{}, err
	}
	var cred *unix.Ucred
	var serr error
	if err := rc.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return caller{}, err
	}
	if serr != nil {
		return caller{}, fmt.Errorf("SO_PEERCRED: %w", serr)
	}
	return caller{uid: int(cred.Uid), gid: int(cred.Gid)}, nil
}

// readMsg reads one request and the descriptors attached.
func readMsg(c *net.UnixConn) (request, []int, error) {
	var req request
	b := make([]byte, maxRequest)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.ReadMsgUnix(b, oob)
	if err != nil {
		return req, nil, err
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		return req, fds, err
	}
	if err := json.Unmarshal(b[:n], &req); err != nil {
		return req, fds, fmt.Errorf("bad request: %w", err)
	}
	return req, fds, nil
}

// rights returns the descriptors of SCM_RIGHTS messages in oob.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_RIGHTS {
			r, err := unix.ParseUnixRights(&m)
			if err != nil {
				closeFDs(fds)
				return nil, err
			}
			fds = append(fds, r...)
		}
	}
	return fds, nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
