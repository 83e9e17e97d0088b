// SPDX-License-Identifier: MIT

package capture

import (
	"encoding/binary"
	"time"
)

// Link types of the pcap global header (tcpdump.org/linktypes.html).
const (
	// LinkRaw: each record is an IPv4 or IPv6 packet.
	LinkRaw uint32 = 101
	// LinkEthernet: each record is an Ethernet frame.
	LinkEthernet uint32 = 1
)

// pcap record and header sizes.
const (
	globalHeaderLen = 24
	recordHeaderLen = 16
	ethHeaderLen    = 14
)

// DefaultSnaplen is the longest packet prefix a capture keeps unless told
// otherwise: whole packets (the tunnel's MTU is far below it).
const DefaultSnaplen = 65535

// GlobalHeader returns the 24-byte pcap file header (microsecond
// timestamps, little-endian, version 2.4) for link type link.
func GlobalHeader(snaplen int, link uint32) []byte {
	h := make([]byte, globalHeaderLen)
	binary.LittleEndian.PutUint32(h[0:], 0xa1b2c3d4)
	binary.LittleEndian.PutUint16(h[4:], 2)
	binary.LittleEndian.PutUint16(h[6:], 4)
	// thiszone, sigfigs: 0
	binary.LittleEndian.PutUint32(h[16:], uint32(snaplen))
	binary.LittleEndian.PutUint32(h[20:], link)
	return h
}

// putRecordHeader fills h (16 bytes) for a packet of origLen bytes of
// which capLen are kept, seen at ts.
func putRecordHeader(h []byte, ts time.Time, capLen, origLen int) {
	binary.LittleEndian.PutUint32(h[0:], uint32(ts.Unix()))
	binary.LittleEndian.PutUint32(h[4:], uint32(ts.Nanosecond()/1000))
	binary.LittleEndian.PutUint32(h[8:], uint32(capLen))
	binary.LittleEndian.PutUint32(h[12:], uint32(origLen))
}

// MACs of the Ethernet frames written to a TAP device: locally
// administered, one for the jobs' side and one for the outside.
var (
	jobMAC     = [6]byte{0x02, 0xa1, 0x00, 0x00, 0x00, 0x01}
	outsideMAC = [6]byte{0x02, 0xa1, 0x00, 0x00, 0x00, 0x02}
)

// putEthHeader fills h (14 bytes) for packet p sent by a job (out) or to
// one.
func putEthHeader(h []byte, p []byte, out bool) {
	src, dst := outsideMAC, jobMAC
	if out {
		src, dst = jobMAC, outsideMAC
	}
	copy(h[0:6], dst[:])
	copy(h[6:12], src[:])
	typ := uint16(0x0800)
	if len(p) > 0 && p[0]>>4 == 6 {
		typ = 0x86dd
	}
	binary.BigEndian.PutUint16(h[12:], typ)
}
