// SPDX-License-Identifier: MIT

package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-vpn/airlock/internal/control"
)

// The job's bearer token. At a gateway that takes them (its load report
// says so: control.Health.Bearer), airlock run presents the job's bearer
// token, found as the WLCG Bearer Token Discovery profile says, with the
// join and again with every renewal: the gateway takes the job's identity
// (issuer, subject, groups) from it, and a pilot that refreshes the token
// file keeps its jobs' leases alive. The token is read again at every
// renewal and rejoin; it goes only to the gateway (pinned TLS), never
// into the job's environment or argv: what the job's environment holds
// is what the pilot put there (a job that reads BEARER_TOKEN_FILE for its
// own data access keeps doing so), and airlock run adds nothing.
//
// Discovery, first found wins: the token in BEARER_TOKEN; the file
// BEARER_TOKEN_FILE names (an error if it cannot be read: the pilot said
// where the token is); $XDG_RUNTIME_DIR/bt_u$UID; /tmp/bt_u$UID. A
// discovered file must be a regular file owned by the job's user and not
// writable by others: /tmp is shared, and a token another user planted
// there would make the job's traffic theirs.

// Bearer modes of Config.Bearer.
const (
	// BearerAuto presents the discovered token to gateways that take
	// bearer tokens (the default).
	BearerAuto = "auto"
	// BearerOff never presents one.
	BearerOff = "off"
)

// Environment of the WLCG Bearer Token Discovery profile.
const (
	EnvBearerToken     = "BEARER_TOKEN"
	EnvBearerTokenFile = "BEARER_TOKEN_FILE"
)

// maxBearerFile bounds a token file.
const maxBearerFile = control.MaxBearer

// jobBearer finds the job's bearer token. Owned by the session.
type jobBearer struct {
	mode   string
	getenv func(string) string
	uid    int
	tmp    string // "/tmp"; tests change it
	// used reports that the current lease was joined with a token, so
	// that renewals carry it again.
	used bool
}

// newJobBearer checks the mode.
func newJobBearer(mode string, getenv func(string) string) (*jobBearer, error) {
	switch mode {
	case "":
		mode = BearerAuto
	case BearerAuto, BearerOff:
	default:
		return nil, fmt.Errorf("bad --bearer %q: want auto or off", mode)
	}
	return &jobBearer{mode: mode, getenv: getenv, uid: os.Getuid(), tmp: "/tmp"}, nil
}

// find returns the current token and where it was found ("" and no
// error: none).
func (b *jobBearer) find() (tok, from string, err error) {
	if b == nil || b.mode == BearerOff {
		return "", "", nil
	}
	if t := strings.TrimSpace(b.getenv(EnvBearerToken)); t != "" {
		if err := checkBearerText(t); err != nil {
			return "", EnvBearerToken, fmt.Errorf("%s: %w", EnvBearerToken, err)
		}
		return t, EnvBearerToken, nil
	}
	if f := b.getenv(EnvBearerTokenFile); f != "" {
		t, err := b.readFile(f)
		if err != nil {
			return "", f, fmt.Errorf("%s=%s: %w", EnvBearerTokenFile, f, err)
		}
		return t, f, nil
	}
	name := "bt_u" + strconv.Itoa(b.uid)
	var dirs []string
	if d := b.getenv("XDG_RUNTIME_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	for _, d := range append(dirs, b.tmp) {
		f := filepath.Join(d, name)
		t, err := b.readFile(f)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return "", f, err
		}
		return t, f, nil
	}
	return "", "", nil
}

// readFile reads a token file: regular, the job user's own, not writable
// by group or others, at most maxBearerFile bytes of one token.
func (b *jobBearer) readFile(path string) (string, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return "", err
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.Mode().IsRegular():
		return "", fmt.Errorf("token file %s: not a regular file", path)
	case st != nil && int(st.Uid) != b.uid:
		return "", fmt.Errorf("token file %s: owned by uid %d, not by the job's user (uid %d): refusing a token another user could have put there", path, st.Uid, b.uid)
	case fi.Mode().Perm()&0o022 != 0:
		return "", fmt.Errorf("token file %s: writable by others (mode %v): make it 0600", path, fi.Mode().Perm())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxBearerFile+1))
	if err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	if len(data) > maxBearerFile {
		return "", fmt.Errorf("token file %s: larger than %d bytes", path, maxBearerFile)
	}
	t := strings.TrimSpace(string(data))
	if err := checkBearerText(t); err != nil {
		return "", fmt.Errorf("token file %s: %w", path, err)
	}
	return t, nil
}

// checkBearerText checks that t looks like a JWT.
func checkBearerText(t string) error {
	if t == "" {
		return errors.New("empty")
	}
	if strings.Count(t, ".") != 2 || strings.ContainsAny(t, " \t\r\n") {
		return errors.New("not a JWT (want header.payload.signature on one line)")
	}
	return nil
}

// add puts the current token into a join of req at gw, if gw takes
// bearer tokens. A token that cannot be read is a definite error when
// the join has no other credential, else it is logged and the join goes
// on without. The job's token is looked for first: without one (a site
// that joins with its own tokens) the gateway is not asked whether it
// takes them, which with one gateway would cost the join a round trip
// (a load report) for nothing.
func (b *jobBearer) add(ctx context.Context, s *Session, gw *gatewayEntry, req control.JoinRequest) (control.JoinRequest, error) {
	req.Bearer = ""
	if b == nil {
		return req, nil
	}
	b.used = false
	if b.mode == BearerOff {
		return req, nil
	}
	tok, from, err := b.find()
	if (err == nil && tok == "") || !takesBearer(ctx, gw) {
		return req, nil
	}
	switch {
	case err != nil && req.Token == "" && req.Attest == nil:
		return req, fmt.Errorf("the job's bearer token: %w", err)
	case err != nil:
		s.log.Warn("the job's bearer token cannot be read; joining without it", "from", from, "err", err)
		return req, nil
	case tok == "":
		return req, nil
	}
	s.log.Debug("presenting the job's bearer token", "from", from)
	req.Bearer, b.used = tok, true
	return req, nil
}

// renewal returns the token a renewal carries: the current one, if the
// lease was joined with one ("" else, or if it cannot be read now: the
// gateway then ends the lease when the last token it saw expires).
func (b *jobBearer) renewal(s *Session) string {
	if b == nil || !b.used {
		return ""
	}
	tok, from, err := b.find()
	if err != nil || tok == "" {
		s.log.Warn("the job's bearer token cannot be read at renewal; the lease ends when the last one presented expires", "from", from, "err", err)
		return ""
	}
	return tok
}

// takesBearer reports whether gw takes bearer tokens, asking its load
// report if the session has none yet.
func takesBearer(ctx context.Context, gw *gatewayEntry) bool {
	checks(ctx, gw) // fills gw.bearer from the same report
	return gw.bearer
}

// BearerToken is what airlock run --check says of the job's bearer
// token: where it was found and what it claims (read without checking
// its signature, which only the gateway can).
type BearerToken struct {
	From            string
	Issuer, Subject string
	Expires         time.Time
}

// FindBearer finds the job's bearer token as airlock run would (cfg's
// Bearer mode and Getenv, nil meaning os.Getenv); a zero BearerToken and
// no error if there is none.
func FindBearer(cfg Config) (BearerToken, error) {
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	b, err := newJobBearer(cfg.Bearer, cfg.Getenv)
	if err != nil {
		return BearerToken{}, err
	}
	tok, from, err := b.find()
	if err != nil || tok == "" {
		return BearerToken{From: from}, err
	}
	bt := BearerToken{From: from}
	_, payload, _ := strings.Cut(tok, ".")
	payload, _, _ = strings.Cut(payload, ".")
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	var c struct {
		Iss string `json:"iss"`
		Sub string `json:"sub"`
		Exp int64  `json:"exp"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &c)
	}
	if err != nil {
		return bt, fmt.Errorf("token from %s: unreadable payload: %w", from, err)
	}
	bt.Issuer, bt.Subject = c.Iss, c.Sub
	if c.Exp > 0 {
		bt.Expires = time.Unix(c.Exp, 0)
	}
	return bt, nil
}
