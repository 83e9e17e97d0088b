// SPDX-License-Identifier: MIT

package munge

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"
	"time"
)

// appendDecodeResponse is munged's side of a decode: the body of a
// response for c with error code and msg (tests and fuzz seeds only).
func appendDecodeResponse(b []byte, c Credential, code Code, msg string) []byte {
	b = append(b, byte(code))
	if msg != "" {
		b = append(b, byte(len(msg)+1))
		b = append(append(b, msg...), 0)
	} else {
		b = append(b, 0)
	}
	b = append(b, c.Cipher, c.MAC, c.Zip, 0)
	b = binary.BigEndian.AppendUint32(b, uint32(c.TTL/time.Second))
	if c.Origin.Is4() {
		a := c.Origin.As4()
		b = append(append(b, 4), a[:]...)
	} else {
		b = append(b, 0)
	}
	unix := func(t time.Time) uint32 {
		if t.IsZero() {
			return 0
		}
		return uint32(t.Unix())
	}
	b = binary.BigEndian.AppendUint32(b, unix(c.Encoded))
	b = binary.BigEndian.AppendUint32(b, unix(c.Decoded))
	for _, v := range []uint32{c.UID, c.GID, c.AuthUID, c.AuthGID, uint32(len(c.Payload))} {
		b = binary.BigEndian.AppendUint32(b, v)
	}
	return append(b, c.Payload...)
}

// FuzzDecodeResponse feeds arbitrary bytes to the parser of munged's
// decode answers, which is all the gateway trusts about a credential.
// Invariants: it never panics; what it accepts is exactly what it read
// (marshalled again and parsed, the same credential); an error from
// munged never comes with an identity, except for the expired, rewound
// and replayed credentials munged reports; a payload is never longer than
// the body.
func FuzzDecodeResponse(f *testing.F) {
	ok := Credential{UID: 1000, GID: 1000, AuthUID: AnyID, AuthGID: AnyID, Origin: netip.MustParseAddr("10.1.2.3"),
		Encoded: time.Unix(1_700_000_000, 0), Decoded: time.Unix(1_700_000_003, 0), TTL: 300 * time.Second,
		Cipher: 4, MAC: 5, Zip: 0, Payload: []byte("airlock-join/1\ngateway=sha256:00\n")}
	f.Add(appendDecodeResponse(nil, ok, 0, ""))
	f.Add(appendDecodeResponse(nil, ok, ReplayedCode, "Replayed credential"))
	f.Add(appendDecodeResponse(nil, Credential{}, InvalidCode, "Invalid credential"))
	f.Add(appendDecodeResponse(nil, Credential{UID: 0, Payload: []byte("airlock-job/1\n")}, 0, ""))
	f.Add([]byte{})
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Fuzz(func(t *testing.T, body []byte) {
		c, err := ParseDecodeResponse(body)
		if len(c.Payload) > len(body) {
			t.Fatalf("payload of %d bytes from a body of %d", len(c.Payload), len(body))
		}
		if err != nil {
			var e *Error
			if c.UID != 0 || c.Payload != nil || c.Origin.IsValid() {
				if !asError(err, &e) || (e.Code != ExpiredCode && e.Code != RewoundCode && e.Code != ReplayedCode) {
					t.Fatalf("error %v with an identity %+v", err, c)
				}
			}
			return
		}
		again, err := ParseDecodeResponse(appendDecodeResponse(nil, c, 0, ""))
		if err != nil {
			t.Fatalf("accepted %+v, which does not parse again: %v", c, err)
		}
		if again.UID != c.UID || again.GID != c.GID || again.Origin != c.Origin || !bytes.Equal(again.Payload, c.Payload) ||
			!again.Encoded.Equal(c.Encoded) || again.TTL != c.TTL || again.AuthUID != c.AuthUID {
			t.Fatalf("parsed %+v, again %+v", c, again)
		}
	})
}

func asError(err error, e **Error) bool {
	for err != nil {
		if x, ok := err.(*Error); ok {
			*e = x
			return true
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		err = u.Unwrap()
	}
	return false
}
