// SPDX-License-Identifier: MIT

package main

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/capture"
)

func TestCopyRecords(t *testing.T) {
	var in bytes.Buffer
	in.Write(capture.GlobalHeader(65535, capture.LinkRaw))
	for i := range 3 {
		var h [16]byte
		binary.LittleEndian.PutUint32(h[8:], uint32(10+i))
		binary.LittleEndian.PutUint32(h[12:], uint32(10+i))
		in.Write(h[:])
		in.Write(bytes.Repeat([]byte{byte(i)}, 10+i))
	}
	all := in.Bytes()
	var out bytes.Buffer
	n, err := copyRecords(&out, bytes.NewReader(all), 2)
	if err != nil || n != 2 || out.Len() != 24+16+10+16+11 {
		t.Errorf("-c 2: got %d records, %d bytes, %v; want 2 records, %d bytes", n, out.Len(), err, 24+16+10+16+11)
	}
	out.Reset()
	n, err = copyRecords(&out, bytes.NewReader(all), 0)
	if err != nil || n != 3 || !bytes.Equal(out.Bytes(), all) {
		t.Errorf("all: got %d records, %v; want the 3 records unchanged", n, err)
	}
	// A truncated stream is an error, not a silent end.
	if _, err := copyRecords(&out, bytes.NewReader(all[:len(all)-1]), 0); err == nil {
		t.Error("truncated stream: got nil error")
	}
}

func TestCaptureArgs(t *testing.T) {
	var stderr bytes.Buffer
	code := run([]string{"capture", "--state", t.TempDir(), "4242", "tcp", "port", "http"}, &bytes.Buffer{}, &stderr)
	if code == 0 || !strings.Contains(stderr.String(), "port \"http\"") {
		t.Errorf("bad filter: exit %d, %q; want a failure naming the port", code, stderr.String())
	}
	stderr.Reset()
	code = run([]string{"capture", "4242", "-w", "/nonexistent/x.pcap", "tcp"}, &bytes.Buffer{}, &stderr)
	if code != exitFailure || !strings.Contains(stderr.String(), "/nonexistent/x.pcap") {
		t.Errorf("flags after JOB: exit %d, %q; want a failure to create -w's file", code, stderr.String())
	}
	stderr.Reset()
	code = run([]string{"capture", "--state", "", "4242"}, &bytes.Buffer{}, &stderr)
	if code != exitUsage || !strings.Contains(stderr.String(), "--state is empty") {
		t.Errorf("empty --state: exit %d, %q; want a usage error asking for --state", code, stderr.String())
	}
}
