// SPDX-License-Identifier: MIT

package packaging

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-vpn/airlock/internal/envfile"
	"github.com/airlock-vpn/airlock/internal/preflight"
	"github.com/airlock-vpn/airlock/test/topology"
)

// unitLines returns the values of key= in the unit, in order.
func unitLines(t *testing.T, key string) []string {
	t.Helper()
	b, err := os.ReadFile("airlock-gateway.service")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// expand does systemd's ${VAR} expansion of an ExecStart= line (each word
// whole: the unit quotes nothing) with env.
func expand(line string, env map[string]string) []string {
	re := regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)
	var argv []string
	for _, w := range strings.Fields(line) {
		argv = append(argv, re.ReplaceAllStringFunc(w, func(m string) string { return env[m[2:len(m)-1]] }))
	}
	return argv
}

// TestConffile: every variable the shipped conffile names is one of the
// gateway's, the listen address is the one setting left empty (required),
// and the unit reads the file in both families' places, with a command
// line that sets nothing the file does not say.
func TestConffile(t *testing.T) {
	b, err := os.ReadFile("airlock-gateway.default")
	if err != nil {
		t.Fatal(err)
	}
	help, err := exec.Command(topology.BuildAirlock(t), "gateway", "--help").Output()
	if err != nil {
		t.Fatal(err)
	}
	names := regexp.MustCompile(`(?m)^#?(AIRLOCK_GATEWAY_[A-Z0-9_]+)=`).FindAllSubmatch(b, -1)
	if len(names) < 8 {
		t.Fatalf("the conffile names %d settings", len(names))
	}
	for _, m := range names {
		if !bytes.Contains(help, []byte("env "+string(m[1])+")")) && !bytes.Contains(help, []byte("env "+string(m[1])+",")) {
			t.Errorf("the conffile names %s, which no gateway flag reads", m[1])
		}
	}
	vars, err := envfile.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := vars["AIRLOCK_GATEWAY_LISTEN"]; !ok || v != "" || len(vars) != 1 {
		t.Errorf("the conffile sets %v, want only an empty AIRLOCK_GATEWAY_LISTEN (the admin names the inside address)", vars)
	}
	if got, want := unitLines(t, "EnvironmentFile"), []string{"-/etc/default/airlock-gateway", "-/etc/sysconfig/airlock-gateway"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("EnvironmentFile= %q, want %q", got, want)
	}
	exec := unitLines(t, "ExecStart")
	if len(exec) != 1 || exec[0] != "/usr/bin/airlock gateway --listen=${AIRLOCK_GATEWAY_LISTEN}" {
		t.Errorf("ExecStart= %q: want the gateway with only the conffile's listen address", exec)
	}
	if r := unitLines(t, "ExecReload"); len(r) != 1 || r[0] != "/usr/bin/airlock gateway reload" {
		t.Errorf("ExecReload= %q, want airlock gateway reload", r)
	}
	if ty := unitLines(t, "Type"); len(ty) != 1 || ty[0] != "notify" {
		t.Errorf("Type= %q, want notify", ty)
	}
}

// TestServiceListensWhereConffileSays runs the unit's ExecStart as systemd
// would (no systemd runs PID 1 on the test machine): the conffile as
// shipped with the admin's edits (the listen address on an inside
// interface of a namespace that also has an outside one, a config file,
// the state directory), ${VAR} expanded from it, as an unprivileged user,
// NOTIFY_SOCKET on a datagram socket of the test and stderr a file named by
// JOURNAL_STREAM. The gateway must say READY=1, listen on the inside
// address only (the control API; WireGuard's UDP see below), advertise it in join.env, log with journal
// priorities, and answer ExecReload with RELOADING=1 and READY=1, failing
// it for a bad config file. Without the admin's listen address it must
// not start.
func TestServiceListensWhereConffileSays(t *testing.T) {
	topology.RequireRoot(t)
	need(t, "setpriv")
	need(t, "nsenter")
	need(t, "ss")
	node := topology.NewTUNNode(t, topology.UserTUNMode)
	u := topology.EnsureUser(t)
	bin := topology.BuildAirlock(t)
	dir := topology.TempDir(t)
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(state, u.UID, u.GID); err != nil {
		t.Fatal(err)
	}
	config := filepath.Join(dir, "gateway.toml")
	if err := os.WriteFile(config, []byte("version = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	shipped, err := os.ReadFile("airlock-gateway.default")
	if err != nil {
		t.Fatal(err)
	}
	// The admin's edits.
	conf := strings.Replace(string(shipped), "\nAIRLOCK_GATEWAY_LISTEN=\n", "\nAIRLOCK_GATEWAY_LISTEN=10.77.0.1:8443\n", 1)
	conf = strings.Replace(conf, "#AIRLOCK_GATEWAY_CONFIG=/etc/airlock/gateway.toml", "AIRLOCK_GATEWAY_CONFIG="+config, 1)
	conf = strings.Replace(conf, "#AIRLOCK_GATEWAY_STATE=/var/lib/airlock", "AIRLOCK_GATEWAY_STATE="+state, 1)
	vars, err := envfile.Parse(strings.NewReader(conf))
	if err != nil {
		t.Fatal(err)
	}
	if vars["AIRLOCK_GATEWAY_LISTEN"] != "10.77.0.1:8443" || vars["AIRLOCK_GATEWAY_CONFIG"] != config || vars["AIRLOCK_GATEWAY_STATE"] != state {
		t.Fatalf("the conffile's lines moved: %v", vars)
	}
	execStart := unitLines(t, "ExecStart")[0]
	argv := expand(strings.Replace(execStart, "/usr/bin/airlock", bin, 1), vars)

	// systemd's side: the notify socket and the journal stream.
	sock := filepath.Join(dir, "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}
	stream, err := os.Create(filepath.Join(dir, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(stream.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "NOTIFY_SOCKET=" + sock,
		"JOURNAL_STREAM=" + strconv.FormatUint(st.Dev, 10) + ":" + strconv.FormatUint(st.Ino, 10)}
	for k, v := range vars {
		env = append(env, k+"="+v)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// A host with an inside (10.77.0.1) and an outside (10.88.0.1)
	// interface, in a network namespace of its own.
	full := node.Command(nil, append([]string{"unshare", "--net", "--", "sh", "-c",
		`ip link set lo up && ip link add inside type veth peer name inpeer && ip link add outside type veth peer name outpeer &&
		ip addr add 10.77.0.1/24 dev inside && ip addr add 10.88.0.1/24 dev outside &&
		for i in inside inpeer outside outpeer; do ip link set $i up; done &&
		ip route add default via 10.88.0.2 && gid=$1 && shift && exec setpriv --reuid "$0" --regid "$gid" --clear-groups -- "$@"`,
		strconv.Itoa(u.UID), strconv.Itoa(u.GID)}, argv...)...)
	cmd := exec.CommandContext(ctx, full[0], full[1:]...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stream, stream
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		<-done
	}()
	logs := func() string { b, _ := os.ReadFile(stream.Name()); return string(b) }
	recv := func(what string) string {
		t.Helper()
		buf := make([]byte, 4096)
		_ = l.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := l.Read(buf)
		if err != nil {
			t.Fatalf("waiting for %s on NOTIFY_SOCKET: %v\n%s", what, err, logs())
		}
		return string(buf[:n])
	}
	if m := recv("READY=1"); !strings.HasPrefix(m, "READY=1\n") {
		t.Fatalf("first notification %q, want READY=1", m)
	}

	// What the running service listens on: the inside address only.
	out, err := exec.Command("nsenter", "-t", strconv.Itoa(cmd.Process.Pid), "-n", "ss", "-Htlun").CombinedOutput()
	if err != nil {
		t.Fatalf("ss: %v\n%s", err, out)
	}
	var tcp, udp []string
	for _, f := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if w := strings.Fields(f); len(w) >= 5 && strings.HasSuffix(w[4], ":8443") {
			if w[0] == "tcp" {
				tcp = append(tcp, w[4])
			} else {
				udp = append(udp, w[4])
			}
		}
	}
	if got := strings.Join(tcp, ", "); got != "10.77.0.1:8443" {
		t.Errorf("the service's control API listens on %s, want 10.77.0.1:8443 only:\n%s", got, out)
	}
	// Known and left to internal/tunnel: wireguard-go's StdNetBind binds
	// its UDP port on every address whatever --listen names (WireGuard
	// answers no unauthenticated packet, but the port is open outside).
	t.Logf("WireGuard's UDP sockets: %s", strings.Join(udp, ", "))
	join, _ := os.ReadFile(filepath.Join(state, "join.env"))
	if !strings.Contains(string(join), "AIRLOCK_GATEWAY=10.77.0.1:8443") {
		t.Errorf("join.env advertises:\n%s", join)
	}
	// The journal gets each line with its priority.
	if lg := logs(); !regexp.MustCompile(`(?m)^<6>time=\S+ level=INFO msg="gateway ready"`).MatchString(lg) {
		t.Errorf("the journal stream lacks <6>...gateway ready:\n%s", lg)
	}

	// ExecReload, as the service's user with its environment.
	reload := func() error {
		argv := expand(strings.Replace(unitLines(t, "ExecReload")[0], "/usr/bin/airlock", bin, 1), vars)
		c := exec.Command("setpriv", append([]string{"--reuid", strconv.Itoa(u.UID), "--regid", strconv.Itoa(u.GID), "--clear-groups", "--"}, argv...)...)
		c.Env = env[:1]
		for k, v := range vars {
			c.Env = append(c.Env, k+"="+v)
		}
		out, err := c.CombinedOutput()
		t.Logf("ExecReload: %v\n%s", err, out)
		return err
	}
	if err := reload(); err != nil {
		t.Errorf("ExecReload of a good config: %v", err)
	}
	if m := recv("RELOADING=1"); !strings.HasPrefix(m, "RELOADING=1\nMONOTONIC_USEC=") {
		t.Errorf("reload notified %q, want RELOADING=1", m)
	}
	if m := recv("READY=1"); !strings.HasPrefix(m, "READY=1") {
		t.Errorf("after the reload %q, want READY=1", m)
	}
	if err := os.WriteFile(config, []byte("version = 1\n[[policy.rule]]\naction = \"deny\"\nto = [\"10.0.0.0/33\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := reload(); err == nil {
		t.Error("ExecReload of a bad config succeeded")
	}
	if m := recv("RELOADING=1"); !strings.HasPrefix(m, "RELOADING=1") {
		t.Errorf("bad reload notified %q, want RELOADING=1", m)
	}
	if m := recv("READY=1"); !strings.HasPrefix(m, "READY=1") {
		t.Errorf("after the bad reload %q, want READY=1 (the old config serves)", m)
	}
	if lg := logs(); !regexp.MustCompile(`(?m)^<3>time=\S+ level=ERROR msg="config reload failed`).MatchString(lg) {
		t.Errorf("the journal stream lacks <3>...config reload failed:\n%s", lg)
	}

	// The shipped conffile, unedited: the unit's command refuses to start.
	vars0, _ := envfile.Parse(bytes.NewReader(shipped))
	argv0 := expand(strings.Replace(execStart, "/usr/bin/airlock", bin, 1), vars0)
	out, err = exec.Command(argv0[0], append(argv0[1:], "--state", state)...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--listen is empty") {
		t.Errorf("the unit with the conffile as shipped: %v\n%s", err, out)
	}
}

// TestAppArmorProfile parses the shipped AppArmor profile with AppArmor 4's
// parser (Ubuntu 24.04 has 4.0; the host's if it is 4, else Debian 13's
// in a cached root), which must accept it, name it as preflight does, and
// reject it with its userns rule misspelt (so the parser reads the rule).
func TestAppArmorProfile(t *testing.T) {
	prof, err := os.ReadFile("apparmor/airlock")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"abi <abi/4.0>,", "profile " + preflight.AppArmorProfile + " /usr/bin/airlock flags=(unconfined) {", "\n  userns,\n"} {
		if !strings.Contains(string(prof), want) {
			t.Errorf("the profile lacks %q", want)
		}
	}
	parser := []string{"apparmor_parser"}
	if v, err := exec.Command("apparmor_parser", "--version").Output(); err != nil || !regexp.MustCompile(`version [4-9]\.`).Match(v) {
		root := topology.DebianRoot(t, "trixie-apparmor", "trixie", "apparmor")
		parser = []string{"chroot", root, "apparmor_parser"}
		t.Logf("the host's apparmor_parser is not AppArmor 4 (%q): Debian 13's in %s", bytes.TrimSpace(v), root)
	}
	parse := func(text string, args ...string) (string, error) {
		c := exec.Command(parser[0], append(parser[1:], args...)...)
		c.Stdin = strings.NewReader(text)
		var out, errb bytes.Buffer
		c.Stdout, c.Stderr = &out, &errb
		err := c.Run()
		return out.String() + errb.String(), err
	}
	if out, err := parse(string(prof), "-Q", "-K"); err != nil {
		t.Errorf("apparmor_parser -Q -K: %v\n%s", err, out)
	}
	if out, err := parse(string(prof), "-N"); err != nil || !strings.Contains(out, preflight.AppArmorProfile+"\n") {
		t.Errorf("apparmor_parser -N: %v\n%s", err, out)
	}
	if out, err := parse(strings.Replace(string(prof), "userns,", "usernz,", 1), "-Q", "-K"); err == nil {
		t.Errorf("apparmor_parser accepts a misspelt userns rule:\n%s", out)
	}
}
