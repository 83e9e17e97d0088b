// SPDX-License-Identifier: MIT

package capture

import (
	"net/netip"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/tun"
)

// JobRef names a job for the taps' selection.
type JobRef struct {
	Lease, JobID, Token string
}

// Device is a tun.Device decorator that copies the packets passing through
// it to the attached taps: Write's packets (sent by jobs) before the
// wrapped device sees them, Read's (to jobs) after it returned them. With
// no tap attached it adds one atomic load per call and no allocation. Safe
// for concurrent use.
type Device struct {
	tun.Device
	// taps is the attached taps, nil when there are none.
	taps atomic.Pointer[[]*Tap]

	mu       sync.Mutex
	attached []*Tap
	jobs     map[netip.Addr]JobRef
	counters map[string]*Counters
	active   map[string]int
}

// NewDevice wraps dev.
func NewDevice(dev tun.Device) *Device {
	return &Device{Device: dev, jobs: map[netip.Addr]JobRef{}, counters: map[string]*Counters{}, active: map[string]int{}}
}

// Read reads packets for jobs and copies them to the taps.
func (d *Device) Read(bufs [][]byte, sizes []int, offset int) (int, error) {
	n, err := d.Device.Read(bufs, sizes, offset)
	if taps := d.taps.Load(); taps != nil && n > 0 {
		now := time.Now()
		for _, t := range *taps {
			t.add(bufs[:n], sizes, offset, false, now)
		}
	}
	return n, err
}

// Write copies jobs' packets to the taps and writes them.
func (d *Device) Write(bufs [][]byte, offset int) (int, error) {
	if taps := d.taps.Load(); taps != nil {
		now := time.Now()
		for _, t := range *taps {
			t.add(bufs, nil, offset, true, now)
		}
	}
	return d.Device.Write(bufs, offset)
}

// NewTap makes a tap of cfg, not yet attached.
func (d *Device) NewTap(cfg TapConfig) *Tap {
	if cfg.Snaplen <= 0 || cfg.Snaplen > DefaultSnaplen {
		cfg.Snaplen = DefaultSnaplen
	}
	if cfg.Buffer <= 0 {
		cfg.Buffer = DefaultBuffer
	}
	if cfg.Link == 0 {
		cfg.Link = LinkRaw
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.counters[cfg.Name]
	if c == nil {
		c = &Counters{}
		d.counters[cfg.Name] = c
	}
	return &Tap{cfg: cfg, ring: newRing(cfg.Buffer), counters: c, done: make(chan struct{})}
}

// Attach starts copying packets to t, from an empty ring.
func (d *Device) Attach(t *Tap) {
	t.ring.reset()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(t.cfg.Tokens) > 0 || len(t.cfg.Jobs) > 0 {
		set := map[netip.Addr]struct{}{}
		for a, j := range d.jobs {
			if t.selects(a, j) {
				set[a] = struct{}{}
			}
		}
		t.jobs.Store(&set)
		if len(set) == 0 && t.cfg.EndWithJobs {
			t.end() // the jobs left before the tap came
		}
	}
	if slices.Contains(d.attached, t) {
		return
	}
	d.attached = append(d.attached, t)
	d.active[t.cfg.Name]++
	d.publishLocked()
}

// Detach stops copying packets to t.
func (d *Device) Detach(t *Tap) {
	d.mu.Lock()
	defer d.mu.Unlock()
	i := slices.Index(d.attached, t)
	if i < 0 {
		return
	}
	d.attached = slices.Delete(d.attached, i, i+1)
	d.active[t.cfg.Name]--
	d.publishLocked()
}

func (d *Device) publishLocked() {
	if len(d.attached) == 0 {
		d.taps.Store(nil)
		return
	}
	taps := slices.Clone(d.attached)
	d.taps.Store(&taps)
}

// selects reports whether t's selection names the job at addr.
func (t *Tap) selects(addr netip.Addr, j JobRef) bool {
	return slices.Contains(t.cfg.Tokens, j.Token) ||
		slices.Contains(t.cfg.Jobs, addr.String()) || slices.Contains(t.cfg.Jobs, j.Lease) ||
		(j.JobID != "" && slices.Contains(t.cfg.Jobs, j.JobID))
}

// AddJob tells the taps about a job that joined.
func (d *Device) AddJob(addr netip.Addr, j JobRef) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.jobs[addr] = j
	for _, t := range d.attached {
		old := t.jobs.Load()
		if old == nil || !t.selects(addr, j) {
			continue
		}
		set := make(map[netip.Addr]struct{}, len(*old)+1)
		for a := range *old {
			set[a] = struct{}{}
		}
		set[addr] = struct{}{}
		t.jobs.Store(&set)
	}
}

// RemoveJob tells the taps about a job that left.
func (d *Device) RemoveJob(addr netip.Addr) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.jobs, addr)
	for _, t := range d.attached {
		old := t.jobs.Load()
		if old == nil {
			continue
		}
		if _, ok := (*old)[addr]; !ok {
			continue
		}
		set := make(map[netip.Addr]struct{}, len(*old))
		for a := range *old {
			if a != addr {
				set[a] = struct{}{}
			}
		}
		t.jobs.Store(&set)
		if len(set) == 0 && t.cfg.EndWithJobs {
			t.end()
		}
	}
}

// Stats is one capture name's counts.
type Stats struct {
	Name                  string
	Packets, Bytes, Drops uint64
	// Attached is the number of taps of the name attached now.
	Attached int
}

// Stats returns the counts of every capture name ever used, by name.
func (d *Device) Stats() []Stats {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]Stats, 0, len(d.counters))
	for name, c := range d.counters {
		out = append(out, Stats{Name: name, Packets: c.Packets.Load(), Bytes: c.Bytes.Load(), Drops: c.Drops.Load(), Attached: d.active[name]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
