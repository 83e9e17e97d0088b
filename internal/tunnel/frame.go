// SPDX-License-Identifier: MIT

package tunnel

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Framing of WireGuard messages on a stream (the TCP/TLS transport). A frame
// is a 2-byte big-endian length followed by that many bytes: exactly one
// WireGuard message. A frame is well-formed only if its payload looks like a
// WireGuard message: type 1 (handshake initiation, 148 bytes), 2 (handshake
// response, 92 bytes), 3 (cookie reply, 64 bytes) or 4 (transport data, at
// least 32 bytes), with the three reserved header bytes zero. Anything else
// is malformed and ends the stream it came on (and only that stream): a
// stream is never resynchronised.

// FrameHeaderLen is the size of a frame's length prefix.
const FrameHeaderLen = 2

// MaxFramePayload is the largest payload a frame can carry.
const MaxFramePayload = 1<<16 - 1

// WireGuard message types and sizes (see the WireGuard paper, section 5.4).
const (
	wgInitiation     = 1
	wgResponse       = 2
	wgCookieReply    = 3
	wgTransport      = 4
	wgInitiationSize = 148
	wgResponseSize   = 92
	wgCookieSize     = 64
	wgMinTransport   = 32
)

// ErrMalformedFrame reports a frame that is not one WireGuard message.
var ErrMalformedFrame = errors.New("malformed frame")

// CheckMessage reports whether p is shaped like one WireGuard message; it
// returns an error wrapping ErrMalformedFrame if not. It does not
// authenticate anything.
func CheckMessage(p []byte) error {
	if len(p) < 4 {
		return fmt.Errorf("%w: %d bytes, shorter than a WireGuard header", ErrMalformedFrame, len(p))
	}
	if p[1] != 0 || p[2] != 0 || p[3] != 0 {
		return fmt.Errorf("%w: reserved bytes not zero", ErrMalformedFrame)
	}
	var ok bool
	switch p[0] {
	case wgInitiation:
		ok = len(p) == wgInitiationSize
	case wgResponse:
		ok = len(p) == wgResponseSize
	case wgCookieReply:
		ok = len(p) == wgCookieSize
	case wgTransport:
		ok = len(p) >= wgMinTransport
	default:
		return fmt.Errorf("%w: unknown message type %d", ErrMalformedFrame, p[0])
	}
	if !ok {
		return fmt.Errorf("%w: message type %d with %d bytes", ErrMalformedFrame, p[0], len(p))
	}
	return nil
}

// AppendFrame appends the frame carrying msg to dst. msg must be at most
// MaxFramePayload bytes.
func AppendFrame(dst, msg []byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(msg)))
	return append(dst, msg...)
}

// FrameReader reads frames from a stream. It is not safe for concurrent
// use; its zero value is not usable, call NewFrameReader.
type FrameReader struct {
	r *bufio.Reader
}

// NewFrameReader returns a reader of frames from r, buffering up to size
// bytes (at least one maximal frame).
func NewFrameReader(r io.Reader, size int) *FrameReader {
	if size < FrameHeaderLen+MaxFramePayload {
		size = FrameHeaderLen + MaxFramePayload
	}
	return &FrameReader{r: bufio.NewReaderSize(r, size)}
}

// Next reads the next frame's payload into dst and returns its length. It
// blocks until a whole frame has arrived. A frame longer than dst or whose
// payload fails CheckMessage returns an error wrapping ErrMalformedFrame;
// the stream is then unusable. A stream that ends between frames returns
// io.EOF, inside a frame io.ErrUnexpectedEOF.
func (fr *FrameReader) Next(dst []byte) (int, error) {
	hdr, err := fr.r.Peek(FrameHeaderLen)
	if err != nil {
		if errors.Is(err, io.EOF) && len(hdr) > 0 {
			return 0, io.ErrUnexpectedEOF
		}
		return 0, err
	}
	n := int(binary.BigEndian.Uint16(hdr))
	if n > len(dst) {
		return 0, fmt.Errorf("%w: %d bytes, more than the %d-byte buffer", ErrMalformedFrame, n, len(dst))
	}
	if n < 4 {
		return 0, fmt.Errorf("%w: %d bytes, shorter than a WireGuard header", ErrMalformedFrame, n)
	}
	fr.r.Discard(FrameHeaderLen)
	if _, err := io.ReadFull(fr.r, dst[:n]); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, err
	}
	if err := CheckMessage(dst[:n]); err != nil {
		return 0, err
	}
	return n, nil
}

// Buffered returns the payload length of the next frame if the whole
// frame is already buffered, so that Next would not block.
func (fr *FrameReader) Buffered() (int, bool) {
	b := fr.r.Buffered()
	if b < FrameHeaderLen {
		return 0, false
	}
	hdr, _ := fr.r.Peek(FrameHeaderLen)
	n := int(binary.BigEndian.Uint16(hdr))
	return n, b >= FrameHeaderLen+n
}
