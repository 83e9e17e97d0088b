// SPDX-License-Identifier: MIT

package tunnel

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func wgMessage(typ byte, n int) []byte {
	p := make([]byte, n)
	p[0] = typ
	for i := 4; i < n; i++ {
		p[i] = byte(i)
	}
	return p
}

func TestCheckMessage(t *testing.T) {
	tests := []struct {
		name string
		p    []byte
		ok   bool
	}{
		{"initiation", wgMessage(1, 148), true},
		{"response", wgMessage(2, 92), true},
		{"cookie", wgMessage(3, 64), true},
		{"keepalive", wgMessage(4, 32), true},
		{"data", wgMessage(4, 1452), true},
		{"short initiation", wgMessage(1, 147), false},
		{"short transport", wgMessage(4, 31), false},
		{"type 0", wgMessage(0, 148), false},
		{"type 5", wgMessage(5, 148), false},
		{"reserved set", append([]byte{4, 0, 1, 0}, make([]byte, 40)...), false},
		{"empty", nil, false},
	}
	for _, tt := range tests {
		err := CheckMessage(tt.p)
		if (err == nil) != tt.ok {
			t.Errorf("%s: got %v, want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrMalformedFrame) {
			t.Errorf("%s: %v does not wrap ErrMalformedFrame", tt.name, err)
		}
	}
}

func TestFrameReader(t *testing.T) {
	msgs := [][]byte{wgMessage(1, 148), wgMessage(2, 92), wgMessage(4, 1452), wgMessage(4, 32)}
	var stream []byte
	for _, m := range msgs {
		stream = AppendFrame(stream, m)
	}
	fr := NewFrameReader(bytes.NewReader(stream), 0)
	buf := make([]byte, MaxFramePayload)
	for i, want := range msgs {
		n, err := fr.Next(buf)
		if err != nil || !bytes.Equal(buf[:n], want) {
			t.Fatalf("frame %d: got %d bytes, %v; want %d bytes", i, n, err, len(want))
		}
	}
	if _, err := fr.Next(buf); err != io.EOF {
		t.Errorf("after the last frame: got %v, want io.EOF", err)
	}

	// Malformed: bad type; cut inside a frame; length beyond the buffer.
	bad := AppendFrame(nil, wgMessage(9, 100))
	if _, err := NewFrameReader(bytes.NewReader(bad), 0).Next(buf); !errors.Is(err, ErrMalformedFrame) {
		t.Errorf("bad type: got %v, want ErrMalformedFrame", err)
	}
	if _, err := NewFrameReader(bytes.NewReader(stream[:100]), 0).Next(buf); err != io.ErrUnexpectedEOF {
		t.Errorf("cut frame: got %v, want io.ErrUnexpectedEOF", err)
	}
	if _, err := NewFrameReader(bytes.NewReader(stream), 0).Next(buf[:100]); !errors.Is(err, ErrMalformedFrame) {
		t.Errorf("frame longer than the buffer: got %v, want ErrMalformedFrame", err)
	}
}

// FuzzFrameReader feeds arbitrary bytes to the decoder. Invariants: it
// never panics; every payload it returns is a well-formed WireGuard
// message that fits the buffer; the frames it returned, encoded again,
// are exactly the input's prefix it consumed; it stops at the first error.
func FuzzFrameReader(f *testing.F) {
	var good []byte
	for _, m := range [][]byte{wgMessage(1, 148), wgMessage(2, 92), wgMessage(3, 64), wgMessage(4, 200)} {
		good = AppendFrame(good, m)
	}
	f.Add(good)
	f.Add(good[:77])
	f.Add([]byte{0, 0})
	f.Add([]byte{0xff, 0xff, 4, 0, 0, 0})
	f.Add(append(AppendFrame(nil, wgMessage(4, 40)), 0, 3, 4, 0, 0))
	f.Fuzz(func(t *testing.T, in []byte) {
		fr := NewFrameReader(bytes.NewReader(in), 0)
		buf := make([]byte, 2048)
		var again []byte
		for i := 0; i < len(in); i++ {
			n, err := fr.Next(buf)
			if err != nil {
				if err != io.EOF && err != io.ErrUnexpectedEOF && !errors.Is(err, ErrMalformedFrame) {
					t.Fatalf("unexpected error %v", err)
				}
				if err == io.EOF && len(again) != len(in) {
					t.Fatalf("io.EOF after %d of %d bytes", len(again), len(in))
				}
				break
			}
			if n > len(buf) {
				t.Fatalf("payload %d bytes, buffer %d", n, len(buf))
			}
			if err := CheckMessage(buf[:n]); err != nil {
				t.Fatalf("returned a malformed payload: %v", err)
			}
			again = AppendFrame(again, buf[:n])
			if !bytes.HasPrefix(in, again) {
				t.Fatalf("returned frames are not the input's prefix")
			}
		}
	})
}
