// SPDX-License-Identifier: MIT

// Package pgtest starts a real PostgreSQL server from the distribution's
// packages (Debian's postgresql-15, which scripts/setup.sh installs) for
// tests: the fleet store's unit tests and the end-to-end fleet tests.
//
// Theory of operation: Start runs initdb into a fresh directory and then
// postgres in the foreground, in its own process group, as an unprivileged
// user (postgres refuses to run as root: as root the harness runs it as the
// test user topology.EnsureUser makes, otherwise as the caller). The server
// listens on a unix socket in its own directory, which every network
// namespace of a topology can reach (namespaces share the file system), and
// on a TCP port of 127.0.0.1 with TLS (a self-signed certificate made for
// the run) and SCRAM passwords, for the tests of TLS and password files.
// Local connections are trusted; TCP ones need the password of the role.
// Stop and Restart stop the server by PID (SIGINT: fast shutdown) and start
// it again on the same data directory, for tests of a database outage.
// Cleanup stops it by PID and removes the directory. One cluster serves
// many subtests: each takes a database of its own with CreateDB.
package pgtest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/airlock-vpn/airlock/test/topology"
)

// Superuser is the cluster's superuser role (initdb -U), trusted over the
// unix socket.
const Superuser = "airlock_admin"

// Password is the password of Superuser for TCP connections.
const Password = "pgtest-password"

// Cluster is a running PostgreSQL server. Its methods are safe for
// concurrent use; its zero value is not usable.
type Cluster struct {
	// Dir holds the data directory (Dir/data), the socket (SocketDir),
	// the TLS certificate (CAFile) and the server's log (Dir/log).
	Dir, SocketDir string
	// Port is the TCP port on 127.0.0.1 (and the unix socket's number).
	Port int
	// CAFile is the server certificate, PEM, which clients pin as their
	// root (sslmode=verify-full, host 127.0.0.1 or localhost).
	CAFile string
	// User runs the server; nil when it runs as the caller.
	User *topology.User

	bin string

	mu   sync.Mutex
	proc *exec.Cmd     // guarded by mu: the running postgres
	done chan struct{} // guarded by mu: closed when proc exits
}

// BinDir returns the directory of the newest installed PostgreSQL server
// binaries (/usr/lib/postgresql/N/bin).
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	var ok []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			ok = append(ok, d)
		}
	}
	if len(ok) == 0 {
		return "", fmt.Errorf("no PostgreSQL server under /usr/lib/postgresql: scripts/setup.sh installs postgresql-15")
	}
	sort.Slice(ok, func(i, j int) bool {
		a, _ := strconv.Atoi(filepath.Base(filepath.Dir(ok[i])))
		b, _ := strconv.Atoi(filepath.Base(filepath.Dir(ok[j])))
		return a < b
	})
	return ok[len(ok)-1], nil
}

// Require skips t where no PostgreSQL server is installed, except in CI
// (CI set), where it fails: scripts/setup.sh installs one there.
func Require(t testing.TB) {
	t.Helper()
	if _, err := BinDir(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
}

// Start makes and starts a cluster for t; cleanup stops it and removes it.
func Start(t testing.TB) *Cluster {
	t.Helper()
	bin, err := BinDir()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{bin: bin}
	if os.Geteuid() == 0 {
		c.User = topology.EnsureUser(t)
	}
	dir, err := os.MkdirTemp("", "airlock-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c.Dir, c.SocketDir = dir, filepath.Join(dir, "sock")
	if err := os.Mkdir(c.SocketDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if c.Port, err = freePort(); err != nil {
		t.Fatal(err)
	}
	c.CAFile = filepath.Join(dir, "server.crt")
	if err := writeCert(dir); err != nil {
		t.Fatal(err)
	}
	pwFile := filepath.Join(dir, "pwfile")
	if err := os.WriteFile(pwFile, []byte(Password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.User != nil {
		for _, p := range []string{dir, c.SocketDir, pwFile, filepath.Join(dir, "server.key"), c.CAFile} {
			if err := os.Chown(p, c.User.UID, c.User.GID); err != nil {
				t.Fatal(err)
			}
		}
	}
	data := filepath.Join(dir, "data")
	initdb := c.command(filepath.Join(bin, "initdb"), "-D", data, "-U", Superuser, "--pwfile", pwFile,
		"--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
	if out, err := initdb.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	os.Remove(pwFile)
	conf := fmt.Sprintf(`# Written by the Airlock test harness (test/pgtest).
listen_addresses = '127.0.0.1'
port = %d
unix_socket_directories = '%s'
ssl = on
ssl_cert_file = '%s'
ssl_key_file = '%s'
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 100
shared_buffers = 32MB
log_min_messages = warning
`, c.Port, c.SocketDir, c.CAFile, filepath.Join(dir, "server.key"))
	if err := os.WriteFile(filepath.Join(data, "postgresql.auto.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	hba := "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if c.User != nil {
		for _, f := range []string{"postgresql.auto.conf", "pg_hba.conf"} {
			if err := os.Chown(filepath.Join(data, f), c.User.UID, c.User.GID); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(c.stop)
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
	return c
}

// command makes cmd run as the cluster's user.
func (c *Cluster) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if c.User != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(c.User.UID), Gid: uint32(c.User.GID)}
	}
	cmd.Env = []string{"PATH=/usr/bin:/bin", "LC_ALL=C.UTF-8"}
	return cmd
}

// start starts postgres and waits until it takes connections.
func (c *Cluster) start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc != nil {
		return fmt.Errorf("pgtest: already running")
	}
	logf, err := os.OpenFile(filepath.Join(c.Dir, "log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := c.command(filepath.Join(c.bin, "postgres"), "-D", filepath.Join(c.Dir, "data"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start postgres: %w", err)
	}
	logf.Close()
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	c.proc, c.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return nil
		}
		select {
		case <-done:
			c.proc = nil
			return fmt.Errorf("postgres exited at start: %s", c.logTail())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("postgres does not take connections after 30s: %v; log: %s", err, c.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *Cluster) logTail() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// Stop stops the server (fast shutdown: SIGINT to its PID) and waits for
// it; clients' connections break. Restart starts it again.
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	if err := c.signalAndWait(syscall.SIGINT, 30*time.Second); err != nil {
		t.Fatal(err)
	}
}

// Restart starts a stopped server again on the same data.
func (c *Cluster) Restart(t testing.TB) {
	t.Helper()
	if err := c.start(); err != nil {
		t.Fatal(err)
	}
}

func (c *Cluster) stop() {
	if err := c.signalAndWait(syscall.SIGINT, 10*time.Second); err != nil {
		c.signalAndWait(syscall.SIGKILL, 10*time.Second)
	}
}

// signalAndWait sends sig to the server's process group and waits for it
// to exit.
func (c *Cluster) signalAndWait(sig syscall.Signal, timeout time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return nil
	}
	pid := c.proc.Process.Pid
	// The postmaster stops its children itself; the group is for a
	// postmaster that died without doing so.
	syscall.Kill(pid, sig)
	select {
	case <-c.done:
	case <-time.After(timeout):
		return fmt.Errorf("postgres (pid %d) still running %v after %v", pid, timeout, sig)
	}
	syscall.Kill(-pid, syscall.SIGKILL)
	c.proc = nil
	return nil
}

// DSN returns a connection string to database db as Superuser over the
// unix socket.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", c.SocketDir, c.Port, Superuser, db)
}

// URL returns a postgres:// URL to database db as user over the unix
// socket.
func (c *Cluster) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@/%s?host=%s&port=%d&sslmode=disable", user, db, c.SocketDir, c.Port)
}

// TCPURL returns a postgres:// URL to database db as user over TCP with
// TLS checked against CAFile, without a password.
func (c *Cluster) TCPURL(user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=verify-full&sslrootcert=%s", user, c.Port, db, c.CAFile)
}

// Exec runs sql as Superuser in database db.
func (c *Cluster) Exec(t testing.TB, db, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN(db))
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v", db, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
}

// CreateDB makes a new database for one test and returns its name; it is
// dropped at cleanup.
func (c *Cluster) CreateDB(t testing.TB) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := fmt.Sprintf("t_%x", b)
	c.Exec(t, "postgres", "create database "+name)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		if err != nil {
			return // stopped: the directory goes anyway
		}
		defer conn.Close(context.Background())
		conn.Exec(ctx, "drop database if exists "+name+" with (force)")
	})
	return name
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// writeCert writes a self-signed server certificate for 127.0.0.1 and
// localhost into dir (server.crt, server.key 0600).
func writeCert(dir string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "pgtest"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"localhost"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "server.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "server.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
}

// Connect opens a connection to database db as Superuser.
func (c *Cluster) Connect(t testing.TB, db string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN(db))
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Pid returns the postmaster's process id, 0 when it is stopped.
func (c *Cluster) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil {
		return 0
	}
	return c.proc.Process.Pid
}

// Running reports whether the server process is running.
func (c *Cluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.proc != nil
}

// String describes the cluster for logs.
func (c *Cluster) String() string {
	return strings.Join([]string{"postgres", c.bin, c.Dir}, " ")
}
