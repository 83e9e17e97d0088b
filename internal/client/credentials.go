// SPDX-License-Identifier: MIT

package client

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// The job's credentials — the join token and the lease's secret — stay in
// airlock run; nothing of them reaches the job:
//
//   - The job's environment has neither AIRLOCK_TOKEN nor
//     AIRLOCK_TOKEN_FILE (withoutCredentials). The lease secret is never
//     in an environment.
//   - --token-file PATH (AIRLOCK_TOKEN_FILE) reads the token from a file,
//     so that it is on no command line (/proc/PID/cmdline, ps, is readable
//     by every user of the node). --token still works, with a warning.
//   - Before the job starts, airlock run makes itself non-dumpable
//     (hideFromJob): its /proc/PID/environ and memory, where the token
//     and the lease secret live, are then closed to the job, which runs as
//     the same uid and could otherwise read them.
//
// The token file itself is readable by the job: the job runs as the same
// user, and a file airlock can read the job can read too. The path is kept
// from the job's environment, not from the job; to keep a token from a
// hostile job, give each job a token of its own with a short lifetime, or
// have the batch system remove the file once airlock has read it (airlock
// reads it once, at start).

// Environment variables that carry the join token.
const (
	envToken     = "AIRLOCK_TOKEN"
	envTokenFile = "AIRLOCK_TOKEN_FILE"
)

// maxTokenFile bounds a token file's size: a token is 48 characters.
const maxTokenFile = 4096

// withoutCredentials returns env without the variables that carry the join
// token and root's job credential.
func withoutCredentials(env []string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name == envToken || name == envTokenFile || name == EnvMungeJob {
			continue
		}
		out = append(out, kv)
	}
	return out
}

// errNoToken is resolveToken's answer when no token is given, which is
// fine where the join's MUNGE credential stands in for one.
var errNoToken = errors.New("no join token: set --token-file or AIRLOCK_TOKEN (the admin makes one with 'airlock token create'), or join with a MUNGE credential at a gateway that checks them (a node with munged, --attest), or present the job's bearer token at a gateway that trusts its issuer (BEARER_TOKEN_FILE, --bearer)")

// resolveToken returns the join token from cfg.Token or cfg.TokenFile,
// which must not both be set.
func resolveToken(cfg Config) (string, error) {
	if cfg.TokenFile == "" {
		if cfg.Token == "" {
			return "", errNoToken
		}
		return cfg.Token, nil
	}
	if cfg.Token != "" {
		return "", errors.New("both a token (--token or AIRLOCK_TOKEN) and a token file (--token-file or AIRLOCK_TOKEN_FILE) are set: give one")
	}
	return readTokenFile(cfg.TokenFile)
}

// ResolveToken returns the join token cfg names, from Token or from
// TokenFile, as airlock run would read it (airlock run --check uses it).
func ResolveToken(cfg Config) (string, error) { return resolveToken(cfg) }

// readTokenFile reads a join token from path: the file's only line,
// surrounding white space removed.
func readTokenFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	defer f.Close()
	b := make([]byte, maxTokenFile+1)
	n, err := f.Read(b)
	if err != nil && n == 0 {
		return "", fmt.Errorf("token file %s: empty or unreadable: %w", path, err)
	}
	if n > maxTokenFile {
		return "", fmt.Errorf("token file %s: larger than %d bytes; it should hold just the token", path, maxTokenFile)
	}
	tok := strings.TrimSpace(string(b[:n]))
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("token file %s: want exactly one token on one line", path)
	}
	return tok, nil
}
