// SPDX-License-Identifier: MIT

package capture

import (
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/tun"

	"github.com/airlock-vpn/airlock/internal/jobs"
)

// Device is a tun.Device decorator that copies the packets passing through
// it to the attached taps: Write's packets (sent by jobs) before the
// wrapped device sees them, Read's (to jobs) after it returned them. With
// no tap attached it adds one atomic load per call and no allocation. Safe
// for concurrent use.
type Device struct {
	tun.Device
	// taps is the attached taps, nil when there are none.
	taps atomic.Pointer[[]*Tap]

	// index finds the job of a packet's tunnel address.
	index *jobs.Index

	mu       sync.Mutex
	attached []*Tap
	jobs     map[jobs.ID]jobs.Ref
	counters map[string]*Counters
	active   map[string]int
}

// NewDevice wraps dev; index is the gateway's job index, which maps the
// jobs' packets to their jobs (nil: a fresh one, for a device whose taps
// select no jobs).
func NewDevice(dev tun.Device, index *jobs.Index) *Device {
	if index == nil {
		index = new(jobs.Index)
	}
	return &Device{Device: dev, index: index, jobs: map[jobs.ID]jobs.Ref{}, counters: map[string]*Counters{}, active: map[string]int{}}
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
	return &Tap{cfg: cfg, index: d.index, ring: newRing(cfg.Buffer), counters: c, done: make(chan struct{})}
}

// Attach starts copying packets to t, from an empty ring.
func (d *Device) Attach(t *Tap) {
	t.ring.reset()
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(t.cfg.Tokens) > 0 || len(t.cfg.Jobs) > 0 {
		set := map[jobs.ID]struct{}{}
		for id, ref := range d.jobs {
			if t.selects(id, ref) {
				set[id] = struct{}{}
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

// selects reports whether t's selection names job id: by its token, batch
// job id, lease id or one of its tunnel addresses. With AttestedJobs, a
// batch job id names only jobs whose id is attested.
func (t *Tap) selects(id jobs.ID, ref jobs.Ref) bool {
	if slices.Contains(t.cfg.Tokens, ref.Token) || slices.Contains(t.cfg.Jobs, string(id)) ||
		(ref.JobID != "" && (ref.JobAttested || !t.cfg.AttestedJobs) && slices.Contains(t.cfg.Jobs, ref.JobID)) {
		return true
	}
	for _, a := range t.index.Addrs(id) {
		if slices.Contains(t.cfg.Jobs, a.String()) {
			return true
		}
	}
	return false
}

// AddJob tells the taps about job id, which joined: its tunnel addresses
// must be in the device's index.
func (d *Device) AddJob(id jobs.ID, ref jobs.Ref) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.jobs[id] = ref
	for _, t := range d.attached {
		old := t.jobs.Load()
		if old == nil || !t.selects(id, ref) {
			continue
		}
		set := make(map[jobs.ID]struct{}, len(*old)+1)
		for a := range *old {
			set[a] = struct{}{}
		}
		set[id] = struct{}{}
		t.jobs.Store(&set)
	}
}

// RemoveJob tells the taps about job id, which left.
func (d *Device) RemoveJob(id jobs.ID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.jobs, id)
	for _, t := range d.attached {
		old := t.jobs.Load()
		if old == nil {
			continue
		}
		if _, ok := (*old)[id]; !ok {
			continue
		}
		set := make(map[jobs.ID]struct{}, len(*old))
		for a := range *old {
			if a != id {
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
