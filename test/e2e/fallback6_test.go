package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// httpGetPy fetches /small over HTTP/1.0 from a socket of the family
// argv[1] ("4" or "6") connected to (argv[2], argv[3]) and prints
// "status LINE bytes N peerfamily F".
const httpGetPy = `
import socket, sys
fam = socket.AF_INET6 if sys.argv[1] == "6" else socket.AF_INET
s = socket.socket(fam, socket.SOCK_STREAM)
s.settimeout(20)
s.connect((sys.argv[2], int(sys.argv[3])))
s.sendall(b"GET /small HTTP/1.0\r\nHost: x\r\n\r\n")
d = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    d += b
head, _, body = d.partition(b"\r\n\r\n")
print("status", head.split(b"\r\n")[0].decode(), "bytes", len(body))
`

// runFallbackIPv6 runs the IPv6 subtests of one fallback mode (seccomp,
// preload or proxy); run runs airlock run --mode mode -- ARGS without user
// namespaces, as in TestFallbackModes.
func runFallbackIPv6(t *testing.T, e *env, mode string, run func(t *testing.T, mode string, timeout time.Duration, args ...string) (int, string, string)) {
	inet := e.tp.INETAddr.String()
	if mode != "proxy" {
		t.Run("V4MappedFromIPv6Socket", func(t *testing.T) {
			// A dual-stack program's AF_INET6 socket connecting to an
			// IPv4-mapped address: caught (sockaddr_in6) and carried as
			// IPv4.
			code, out, stderr := run(t, mode, runTimeout, "/usr/bin/python3", "-c", httpGetPy, "6", "::ffff:"+inet, fmt.Sprint(e.httpPort))
			want := fmt.Sprintf(" 200 OK bytes %d", smallSize)
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("AF_INET6 socket to ::ffff:%s: exit %d, %q, want %q%s", inet, code, out, want, e.diag(stderr))
			}
		})
	}
}
