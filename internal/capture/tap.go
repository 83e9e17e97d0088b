// SPDX-License-Identifier: MIT

package capture

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-vpn/airlock/internal/jobs"
)

// DefaultBuffer is a tap's ring size unless told otherwise.
const DefaultBuffer = 4 << 20

// TapConfig describes one capture.
type TapConfig struct {
	// Name labels the capture's metrics; taps with the same name share
	// counters.
	Name string
	// Filter selects packets; nil selects all.
	Filter *Filter
	// Tokens and Jobs select jobs: those that joined with one of Tokens,
	// or whose batch job id, lease id or tunnel address is one of Jobs.
	// Both empty select every job.
	Tokens, Jobs []string
	// Snaplen is the longest prefix of an IP packet kept (an Ethernet
	// capture adds its 14-byte header); 0 means DefaultSnaplen.
	Snaplen int
	// Buffer is the ring's size in bytes; 0 means DefaultBuffer.
	Buffer int
	// Link is LinkRaw (0 too) or LinkEthernet.
	Link uint32
	// EndWithJobs makes Done close once no selected job is left after
	// one left (a live capture of one job ends with it).
	EndWithJobs bool
	// AttestedJobs makes a batch job id in Jobs select only jobs whose id
	// is attested (jobs.Ref.JobAttested): at a gateway with attested
	// identity, a job cannot have itself captured under, or hide among,
	// another job's claimed id.
	AttestedJobs bool
}

// Counters are a capture's cumulative counts. Safe for concurrent use.
type Counters struct {
	// Packets and Bytes were queued for the sink (Bytes: captured
	// lengths); Drops were selected but found the ring full.
	Packets, Bytes, Drops atomic.Uint64
}

// Tap is one capture: its selection, filter and ring. Make it with
// Device.NewTap, attach it with Device.Attach, and drain it with Serve.
// Safe for concurrent use.
type Tap struct {
	cfg      TapConfig
	index    *jobs.Index // the device's: a packet's job by its address
	ring     *ring
	counters *Counters
	// jobs is the set of selected jobs; nil selects every job.
	jobs atomic.Pointer[map[jobs.ID]struct{}]

	doneOnce sync.Once
	done     chan struct{}
}

// Counters returns the tap's counters (shared by taps of its name).
func (t *Tap) Counters() *Counters { return t.counters }

// Done is closed when a tap with EndWithJobs has no job left.
func (t *Tap) Done() <-chan struct{} { return t.done }

func (t *Tap) end() { t.doneOnce.Do(func() { close(t.done) }) }

// selected reports whether t selects the job at tunnel address addr; set
// is t.jobs loaded.
func (t *Tap) selected(set *map[jobs.ID]struct{}, addr netip.Addr) bool {
	if set == nil {
		return true
	}
	id, ok := t.index.Lookup(addr)
	if !ok {
		return false
	}
	_, ok = (*set)[id]
	return ok
}

// recordRoom is the room for a record's headers.
type recordRoom [recordHeaderLen + ethHeaderLen]byte

// add queues the selected packets of a batch: packet i is bufs[i][offset:]
// (sizes nil) or bufs[i][offset:offset+sizes[i]]. It allocates nothing.
func (t *Tap) add(bufs [][]byte, sizes []int, offset int, out bool, ts time.Time) {
	set := t.jobs.Load()
	var hdr recordRoom
	var p packet
	queued := false
	t.ring.mu.Lock()
	for i, b := range bufs {
		if sizes != nil {
			b = b[offset : offset+sizes[i]]
		} else {
			b = b[offset:]
		}
		if !p.parse(b, out) || !t.selected(set, p.job()) || !t.cfg.Filter.matchPacket(&p) {
			continue
		}
		h := hdr[:recordHeaderLen]
		origLen := len(b)
		if t.cfg.Link == LinkEthernet {
			putEthHeader(hdr[recordHeaderLen:], b, out)
			h = hdr[:]
			origLen += ethHeaderLen
		}
		data := b[:min(len(b), t.cfg.Snaplen)]
		capLen := len(h) - recordHeaderLen + len(data)
		putRecordHeader(h, ts, capLen, origLen)
		if len(h)+len(data) > t.ring.freeLocked() {
			t.counters.Drops.Add(1)
			continue
		}
		t.ring.writeLocked(h)
		t.ring.writeLocked(data)
		t.counters.Packets.Add(1)
		t.counters.Bytes.Add(uint64(capLen))
		queued = true
	}
	t.ring.mu.Unlock()
	if queued {
		t.ring.signal()
	}
}

// Writer is where Serve puts the pcap stream.
type Writer interface {
	Write(p []byte) (int, error)
}

// Serve writes the pcap global header and then the tap's records to w
// until ctx ends (it returns ctx's error), Done closes (nil, after what is
// queued), or a write fails (that error). flush, if not nil, is called
// after every write. A write blocked in w is not interrupted by ctx: close
// what w writes to.
func (t *Tap) Serve(ctx context.Context, w Writer, flush func()) error {
	snaplen := t.cfg.Snaplen
	if t.cfg.Link == LinkEthernet {
		snaplen += ethHeaderLen
	}
	if _, err := w.Write(GlobalHeader(snaplen, t.cfg.Link)); err != nil {
		return err
	}
	if flush != nil {
		flush()
	}
	// Write straight from the ring: no copy, and the data path only
	// waits for the lock, never for the writes.
	for {
		a, b := t.ring.peek()
		if len(a) == 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.done:
				if a, _ := t.ring.peek(); len(a) == 0 {
					return nil
				}
			case <-t.ring.wake:
			}
			continue
		}
		for _, p := range [][]byte{a, b} {
			if len(p) == 0 {
				continue
			}
			if _, err := w.Write(p); err != nil {
				return err
			}
			t.ring.release(len(p))
		}
		if flush != nil {
			flush()
		}
	}
}
