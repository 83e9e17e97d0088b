// SPDX-License-Identifier: MIT

// Package munge is a client of MUNGE's daemon, munged, over its local
// socket, in Go: it asks munged to encode a credential (which then carries
// the caller's uid and gid, as the kernel tells munged, and the node's
// address) and to decode one (which checks the MAC, the lifetime and that
// the credential was not decoded before). The airlock binary stays static
// (CGO_ENABLED=0) and needs neither libmunge nor the munge and unmunge
// programs.
//
// Theory of operation: munged serves one request per connection on a
// unix stream socket (default /run/munge/munge.socket.2) and learns the
// client's uid and gid from the socket (SO_PEERCRED on Linux). A request
// and its response are each an 11-byte header — magic 0x00606d4b, protocol
// version 4, message type, retry count, body length, big-endian — and a
// body of big-endian integers and length-prefixed strings (MUNGE's
// src/libcommon/m_msg.c). This package sends version 4 only, sets the
// retry count to 0 and never retries a decode: munged lets a request with
// a non-zero retry count decode a credential again (its socket-retry
// allowance), which would defeat replay detection.
//
// What munged guarantees and this package passes on: a credential decodes
// only with the key that encoded it; its uid and gid are those of the
// process that asked for it; it expires after its time-to-live (munged's
// default 300 s); and each decoding munged lets it decode once
// (ErrReplayed afterwards, until it expires). Replay detection is per
// decoding munged: two gateways with their own munged each accept a
// credential once, so what it authorizes must be bound to one gateway by
// its payload (internal/attest does that).
package munge

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"
)

// DefaultSocket is where Debian's and most distributions' munged listen.
const DefaultSocket = "/run/munge/munge.socket.2"

// DefaultTimeout bounds one request to munged (munged's own socket
// timeout is 2 s).
const DefaultTimeout = 5 * time.Second

// Wire constants (MUNGE src/libcommon/m_msg.h, src/libmunge/munge.h).
const (
	msgMagic   = 0x00606D4B
	msgVersion = 4
	headerLen  = 11

	typeEncodeRequest  = 2
	typeEncodeResponse = 3
	typeDecodeRequest  = 4
	typeDecodeResponse = 5

	// MaxPayload is the largest payload munged encodes
	// (MUNGE_MAXIMUM_PAYLOAD_LEN).
	MaxPayload = 1 << 20
	// maxMessage bounds a body this package sends or accepts
	// (MUNGE_MAXIMUM_REQ_LEN).
	maxMessage = 2 * MaxPayload

	// AnyID is the uid or gid of a credential anyone may decode
	// (MUNGE_UID_ANY, MUNGE_GID_ANY).
	AnyID = ^uint32(0)
)

// Client talks to one munged. Its zero value uses DefaultSocket and
// DefaultTimeout; it is safe for concurrent use (every request has its
// own connection).
type Client struct {
	// Socket is munged's socket path.
	Socket string
	// Timeout bounds each request; zero means DefaultTimeout.
	Timeout time.Duration
}

// EncodeOptions are a credential's parameters; the zero value takes
// munged's defaults (its cipher, MAC and compression, its default
// time-to-live, decodable by anyone).
type EncodeOptions struct {
	// TTL is the credential's lifetime in seconds; 0 means munged's
	// default (300 s), and munged caps it at its maximum (3600 s).
	TTL uint32
	// AuthUID and AuthGID restrict who may decode the credential; zero
	// values mean anyone (AnyID). Set RestrictUID to restrict to uid 0.
	AuthUID, AuthGID uint32
	RestrictUID      bool
	RestrictGID      bool
}

// Credential is what munged says about a credential it decoded.
type Credential struct {
	// UID and GID are those of the process that had it encoded.
	UID, GID uint32
	// AuthUID and AuthGID are who may decode it (AnyID: anyone).
	AuthUID, AuthGID uint32
	// Origin is the address munged on the encoding node reports as its
	// own (its host name's address, or munged --origin); invalid if that
	// munged had none.
	Origin netip.Addr
	// Encoded is when it was made, Decoded when munged decoded it (by
	// their clocks); TTL its lifetime.
	Encoded, Decoded time.Time
	TTL              time.Duration
	// Cipher, MAC and Zip are munged's algorithm numbers; Realm is
	// empty.
	Cipher, MAC, Zip uint8
	Realm            string
	// Payload is what the encoder put in.
	Payload []byte
}

// Encode asks munged to make a credential carrying payload; munged adds
// the caller's uid and gid. It returns the credential's text
// ("MUNGE:...:").
func (c Client) Encode(ctx context.Context, payload []byte, o EncodeOptions) (string, error) {
	if len(payload) > MaxPayload {
		return "", fmt.Errorf("munge encode: payload of %d bytes, more than %d", len(payload), MaxPayload)
	}
	body, err := c.roundTrip(ctx, typeEncodeRequest, appendEncodeRequest(nil, payload, o), typeEncodeResponse)
	if err != nil {
		return "", fmt.Errorf("munge encode: %w", err)
	}
	cred, err := parseEncodeResponse(body)
	if err != nil {
		return "", fmt.Errorf("munge encode: %w", err)
	}
	return cred, nil
}

// Decode asks munged to decode cred. On success the credential is spent
// at that munged: decoding it again fails with ErrReplayed. For an
// expired, rewound or replayed credential munged still reports its
// fields: Decode returns them with the error (an *Error with that Code).
func (c Client) Decode(ctx context.Context, cred string) (Credential, error) {
	if cred == "" || len(cred)+1 > maxMessage-4 {
		return Credential{}, fmt.Errorf("munge decode: %w: credential of %d bytes", ErrInvalid, len(cred))
	}
	body, err := c.roundTrip(ctx, typeDecodeRequest, appendDecodeRequest(nil, cred), typeDecodeResponse)
	if err != nil {
		return Credential{}, fmt.Errorf("munge decode: %w", err)
	}
	cr, err := ParseDecodeResponse(body)
	if err != nil {
		return cr, fmt.Errorf("munge decode: %w", err)
	}
	return cr, nil
}

// roundTrip sends one request of type typ with body and returns the body
// of munged's response, which must be of type want.
func (c Client) roundTrip(ctx context.Context, typ uint8, body []byte, want uint8) ([]byte, error) {
	sock := c.Socket
	if sock == "" {
		sock = DefaultSocket
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", sock)
	if err != nil {
		if errors.Is(err, errNoSuchFile) {
			return nil, fmt.Errorf("%w: no munged socket at %s: is munged running (and is this its socket)?", ErrSocket, sock)
		}
		return nil, fmt.Errorf("%w: %w", ErrSocket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := conn.Write(append(appendHeader(make([]byte, 0, headerLen+len(body)), typ, uint32(len(body))), body...)); err != nil {
		return nil, fmt.Errorf("%w: send to %s: %w", ErrSocket, sock, err)
	}
	var hdr [headerLen]byte
	if _, err := readFull(conn, hdr[:]); err != nil {
		return nil, fmt.Errorf("%w: read from %s: %w", ErrSocket, sock, err)
	}
	got, n, err := parseHeader(hdr[:])
	if err != nil {
		return nil, err
	}
	if got != want {
		return nil, fmt.Errorf("%w: munged answered message type %d, want %d", ErrSocket, got, want)
	}
	resp := make([]byte, n)
	if _, err := readFull(conn, resp); err != nil {
		return nil, fmt.Errorf("%w: read from %s: %w", ErrSocket, sock, err)
	}
	return resp, nil
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		k, err := c.Read(b[n:])
		n += k
		if err != nil {
			if n == len(b) {
				return n, nil
			}
			return n, err
		}
	}
	return n, nil
}

// appendHeader appends a message header of type typ for a body of n
// bytes, retry count 0.
func appendHeader(b []byte, typ uint8, n uint32) []byte {
	b = binary.BigEndian.AppendUint32(b, msgMagic)
	b = append(b, msgVersion, typ, 0)
	return binary.BigEndian.AppendUint32(b, n)
}

// parseHeader returns a header's message type and body length.
func parseHeader(h []byte) (typ uint8, n uint32, err error) {
	if len(h) != headerLen {
		return 0, 0, fmt.Errorf("%w: header of %d bytes", ErrSocket, len(h))
	}
	if m := binary.BigEndian.Uint32(h); m != msgMagic {
		return 0, 0, fmt.Errorf("%w: bad message magic %#x: not munged", ErrSocket, m)
	}
	if h[4] != msgVersion {
		return 0, 0, fmt.Errorf("%w: munged speaks message version %d, this client %d", ErrSocket, h[4], msgVersion)
	}
	n = binary.BigEndian.Uint32(h[7:])
	if n > maxMessage {
		return 0, 0, fmt.Errorf("%w: message of %d bytes, more than %d", ErrSocket, n, maxMessage)
	}
	return h[5], n, nil
}

// appendEncodeRequest appends the body of an encode request.
func appendEncodeRequest(b, payload []byte, o EncodeOptions) []byte {
	const deflt = 1                       // MUNGE_CIPHER_DEFAULT, MUNGE_MAC_DEFAULT, MUNGE_ZIP_DEFAULT
	b = append(b, deflt, deflt, deflt, 0) // cipher, mac, zip, no realm
	b = binary.BigEndian.AppendUint32(b, o.TTL)
	uid, gid := AnyID, AnyID
	if o.RestrictUID || o.AuthUID != 0 {
		uid = o.AuthUID
	}
	if o.RestrictGID || o.AuthGID != 0 {
		gid = o.AuthGID
	}
	b = binary.BigEndian.AppendUint32(b, uid)
	b = binary.BigEndian.AppendUint32(b, gid)
	b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
	return append(b, payload...)
}

// appendDecodeRequest appends the body of a decode request: the
// credential with its terminating NUL, as libmunge sends it.
func appendDecodeRequest(b []byte, cred string) []byte {
	b = binary.BigEndian.AppendUint32(b, uint32(len(cred)+1))
	b = append(b, cred...)
	return append(b, 0)
}

// reader reads big-endian fields of a message body; the first error
// sticks.
type reader struct {
	b   []byte
	err error
}

func (r *reader) bytes(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: %s truncated (%d bytes left, want %d)", ErrSocket, what, len(r.b), n)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8(what string) uint8 {
	if v := r.bytes(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if v := r.bytes(4, what); v != nil {
		return binary.BigEndian.Uint32(v)
	}
	return 0
}

// end checks that the whole body was read.
func (r *reader) end() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d bytes after the message", ErrSocket, len(r.b))
	}
	return r.err
}

// cstring returns a NUL-terminated string field without its NUL.
func cstring(b []byte) string { return strings.TrimRight(string(b), "\x00") }

// parseEncodeResponse returns the credential of an encode response, or
// munged's error.
func parseEncodeResponse(body []byte) (string, error) {
	r := &reader{b: body}
	code := r.u8("error number")
	msg := cstring(r.bytes(int(r.u8("error length")), "error string"))
	data := r.bytes(int(r.u32("data length")), "credential")
	if err := r.end(); err != nil {
		return "", err
	}
	if code != 0 {
		return "", newError(Code(code), msg)
	}
	cred := cstring(data)
	if !strings.HasPrefix(cred, "MUNGE:") {
		return "", fmt.Errorf("%w: munged answered %q, not a credential", ErrSocket, truncate(cred))
	}
	return cred, nil
}

// ParseDecodeResponse parses the body of munged's answer to a decode
// request. On munged's error it returns an *Error with its code; for
// ExpiredCode, RewoundCode and ReplayedCode the Credential's fields are
// set too. It never panics, whatever body holds.
func ParseDecodeResponse(body []byte) (Credential, error) {
	r := &reader{b: body}
	var c Credential
	code := r.u8("error number")
	msg := cstring(r.bytes(int(r.u8("error length")), "error string"))
	c.Cipher, c.MAC, c.Zip = r.u8("cipher"), r.u8("mac"), r.u8("zip")
	c.Realm = cstring(r.bytes(int(r.u8("realm length")), "realm"))
	c.TTL = time.Duration(r.u32("ttl")) * time.Second
	addr := r.bytes(int(r.u8("address length")), "origin address")
	t0, t1 := r.u32("encode time"), r.u32("decode time")
	c.UID, c.GID = r.u32("uid"), r.u32("gid")
	c.AuthUID, c.AuthGID = r.u32("auth uid"), r.u32("auth gid")
	data := r.bytes(int(r.u32("data length")), "payload")
	if err := r.end(); err != nil {
		return Credential{}, err
	}
	switch len(addr) {
	case 0:
	case 4:
		c.Origin = netip.AddrFrom4([4]byte(addr))
		if c.Origin.IsUnspecified() {
			c.Origin = netip.Addr{}
		}
	default:
		return Credential{}, fmt.Errorf("%w: origin address of %d bytes", ErrSocket, len(addr))
	}
	if t0 != 0 {
		c.Encoded = time.Unix(int64(t0), 0)
	}
	if t1 != 0 {
		c.Decoded = time.Unix(int64(t1), 0)
	}
	// libmunge's payload is NUL-terminated beyond its length; munged
	// sends exactly the length.
	if len(data) > 0 {
		c.Payload = append([]byte(nil), data...)
	}
	if code != 0 {
		err := newError(Code(code), msg)
		switch Code(code) {
		case ExpiredCode, RewoundCode, ReplayedCode:
			return c, err
		}
		return Credential{}, err
	}
	return c, nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
