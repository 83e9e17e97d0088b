// SPDX-License-Identifier: MIT

package nsexec

import (
	"errors"
	"io/fs"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/reexec"
)

func TestPreflightMapping(t *testing.T) {
	ok := hostFacts{euid: 1000, maxUserNS: "15000", tunMode: 0o666}
	denied := &fs.PathError{Op: "access", Path: tunPath, Err: unix.EACCES}
	for _, tc := range []struct {
		name  string
		facts func(f *hostFacts)
		kind  error
		errno error
		want  []string
	}{
		{"ok", func(f *hostFacts) {}, nil, nil, nil},
		{"max-user-namespaces-0", func(f *hostFacts) { f.maxUserNS = "0" }, ErrUserNamespace, nil,
			[]string{"user namespaces are disabled: sysctl user.max_user_namespaces=0; ask the admin to raise it, or use --mode auto (the default) or seccomp, preload or proxy, which need neither"}},
		{"unprivileged-userns-clone-0", func(f *hostFacts) { f.unprivUserns = "0" }, ErrUserNamespace, nil,
			[]string{"kernel.unprivileged_userns_clone=0", "--mode auto"}},
		{"unprivileged-userns-clone-0-root", func(f *hostFacts) { f.unprivUserns = "0"; f.euid = 0 }, nil, nil, nil},
		{"apparmor-unconfined", func(f *hostFacts) { f.apparmorRestrict = "1"; f.apparmorLabel = "unconfined" }, ErrUserNamespace, nil,
			[]string{"kernel.apparmor_restrict_unprivileged_userns=1", "AppArmor profile"}},
		{"apparmor-with-profile", func(f *hostFacts) { f.apparmorRestrict = "1"; f.apparmorLabel = "airlock (enforce)" }, nil, nil, nil},
		{"no-tun", func(f *hostFacts) { f.tunStatErr = &fs.PathError{Op: "stat", Path: tunPath, Err: unix.ENOENT} }, ErrNoTUN, unix.ENOENT,
			[]string{"no /dev/net/tun: load the tun module"}},
		{"tun-0600", func(f *hostFacts) { f.tunMode = 0o600; f.tunAccessErr = denied }, ErrTUNPermission, unix.EACCES,
			[]string{"access /dev/net/tun: permission denied", "mode 0600", "ship it 0666", "`chmod 0666 /dev/net/tun`", "CAP_NET_ADMIN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ok
			tc.facts(&f)
			err := f.check()
			checkErr(t, err, tc.kind, tc.errno, tc.want)
		})
	}
}

func TestSetupErrorMapping(t *testing.T) {
	f := hostFacts{euid: 1000, maxUserNS: "15000", tunMode: 0o600}
	for _, tc := range []struct {
		name  string
		r     reexec.Reply
		kind  error
		errno error
		want  []string
	}{
		{"tun-eacces", reexec.Reply{Step: stepTUN, Op: "open", Err: "open /dev/net/tun: permission denied", Errno: int(unix.EACCES)},
			ErrTUNPermission, unix.EACCES,
			[]string{"create tun in job namespace: open /dev/net/tun: permission denied", "mode 0600", "chmod 0666 /dev/net/tun"}},
		{"tun-enoent", reexec.Reply{Step: stepTUN, Op: "open", Err: "open /dev/net/tun: no such file or directory", Errno: int(unix.ENOENT)},
			ErrNoTUN, unix.ENOENT, []string{"no /dev/net/tun"}},
		{"tunsetiff-eperm", reexec.Reply{Step: stepTUN, Err: `ioctl TUNSETIFF "tun0": operation not permitted`, Errno: int(unix.EPERM)},
			ErrUserNamespace, unix.EPERM, []string{"cannot create user namespace", "TUNSETIFF", "kernel.apparmor_restrict_unprivileged_userns"}},
		{"mount-eperm", reexec.Reply{Step: stepMounts, Err: "mount --make-rprivate /: operation not permitted", Errno: int(unix.EPERM)},
			ErrUserNamespace, unix.EPERM, []string{"make mounts private", "user.max_user_namespaces"}},
		{"route-other", reexec.Reply{Step: stepNetwork, Err: "add default route: network is unreachable", Errno: int(unix.ENETUNREACH)},
			ErrSetup, unix.ENETUNREACH, []string{"set up job namespace: configure tun in job namespace: add default route: network is unreachable"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			checkErr(t, f.setupError(tc.r), tc.kind, tc.errno, tc.want)
		})
	}
}

func TestUserNSErrorMapping(t *testing.T) {
	f := hostFacts{euid: 1000, maxUserNS: "15000"}
	for _, errno := range []syscall.Errno{unix.EPERM, unix.ENOSPC, unix.EINVAL} {
		cause := &fs.PathError{Op: "fork/exec", Path: "/proc/self/exe", Err: errno}
		if !isUserNSErrno(cause) {
			t.Errorf("isUserNSErrno(%v): got false, want true", cause)
		}
		checkErr(t, f.userNSError(cause), ErrUserNamespace, errno, []string{
			"cannot create user namespace: fork/exec /proc/self/exe: " + errno.Error(),
			"user.max_user_namespaces", "kernel.unprivileged_userns_clone", "kernel.apparmor_restrict_unprivileged_userns", "--mode auto",
		})
	}
	if isUserNSErrno(unix.ENOENT) {
		t.Errorf("isUserNSErrno(ENOENT): got true, want false")
	}
	f.maxUserNS = "0"
	checkErr(t, f.userNSError(unix.ENOSPC), ErrUserNamespace, unix.ENOSPC, []string{"user namespaces are disabled: sysctl user.max_user_namespaces=0"})
}

func checkErr(t *testing.T, err, kind, errno error, want []string) {
	t.Helper()
	if kind == nil {
		if err != nil {
			t.Fatalf("got %v, want nil", err)
		}
		return
	}
	if !errors.Is(err, kind) {
		t.Errorf("errors.Is(%v, %v): got false, want true", err, kind)
	}
	if errno != nil && !errors.Is(err, errno) {
		t.Errorf("errors.Is(%v, %v): got false, want true", err, errno)
	}
	for _, w := range want {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if s := err.Error(); s != "" && strings.ToLower(s[:1]) != s[:1] {
		t.Errorf("error %q does not start lowercase", s)
	}
}

func TestConfigValidation(t *testing.T) {
	addr := netip.MustParsePrefix("100.64.0.2/16")
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no-args", Config{Addrs: []netip.Prefix{addr}}, "no command"},
		{"no-address", Config{Args: []string{"true"}}, "no valid tunnel address"},
		{"family", Config{Args: []string{"true"}, Addrs: []netip.Prefix{addr}, Gateways: []netip.Addr{netip.MustParseAddr("fd00::1")}}, "different families"},
		{"long-name", Config{Args: []string{"true"}, Addrs: []netip.Prefix{addr}, TUNName: "a-very-long-tun-name"}, "longer than 15"},
		{"mtu", Config{Args: []string{"true"}, Addrs: []netip.Prefix{addr}, MTU: 100}, "mtu 100 out of range"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.cfg.withDefaults()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want error containing %q", err, tc.want)
			}
		})
	}
	c, err := Config{Args: []string{"true"}, Addrs: []netip.Prefix{addr}}.withDefaults()
	if err != nil || c.TUNName != DefaultTUNName || c.MTU != DefaultMTU || c.Logger == nil || c.Stdout != nil && c.Stdout.Name() != "/dev/stdout" {
		t.Errorf("defaults: got %+v, %v", c, err)
	}
}

func TestJobEnv(t *testing.T) {
	got := jobEnv([]string{"A=1", envConfig + "={}", envFD + "=3", "AIRLOCK_GATEWAY=x"})
	if want := "A=1 AIRLOCK_GATEWAY=x"; strings.Join(got, " ") != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
