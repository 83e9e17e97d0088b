// SPDX-License-Identifier: MIT

// Package lease hands out the gateway's tunnel addresses to joined jobs and
// takes them back when a lease is released or expires.
package lease

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"
	"time"

	"github.com/airlock-vpn/airlock/internal/identity"

	"github.com/airlock-vpn/airlock/internal/ipfamily"
)

// Errors returned by Manager.
var (
	// ErrNoAddress means every address of the tunnel subnet is leased.
	ErrNoAddress = errors.New("no free tunnel address")
	// ErrUnknownLease means no live lease matches the id and secret.
	ErrUnknownLease = errors.New("unknown or expired lease")
	// ErrNoPortBlock means every egress port block is leased.
	ErrNoPortBlock = errors.New("no free egress port block")
)

// Lease is one job's hold on its tunnel addresses.
type Lease struct {
	// ID is the lease id, which names the job (jobs.ID) everywhere.
	ID string
	// Addrs are the job's tunnel addresses with their subnets' lengths:
	// first the one the Manager allocates in its subnet (Addr), then,
	// from a dual-stack Manager, the IPv6 one derived from it
	// (dualstack.go).
	Addrs []netip.Prefix
	// Block is the index of the job's (first) egress port block, or -1
	// when the Manager hands out no blocks.
	Block int
	// Blocks is how many blocks the job holds: Block, Block+stride, …,
	// Block+(Blocks-1)×stride (runs.go). 0 means 1 when Block >= 0.
	Blocks int
	// PublicKey is the job's WireGuard public key (opaque here).
	PublicKey [32]byte
	// Owner is who holds the lease, and on whose word (identity.Job).
	Owner   identity.Job
	Start   time.Time
	Expires time.Time

	secretHash [32]byte
}

// Manager allocates addresses from a subnet. It is safe for concurrent use;
// the zero value is not usable, call New.
type Manager struct {
	prefix  netip.Prefix // the tunnel subnet addresses are allocated in
	gateway netip.Addr
	ttl     time.Duration

	blocks int // number of port blocks; 0 means none
	stride int // distance between the blocks of one run (runs.go)

	mu sync.Mutex
	// tunnels are the tunnel prefixes by family (ipfamily.Family.Index):
	// prefix in its family's slot and, on a dual-stack Manager, the IPv6
	// prefix whose addresses embed the allocated IPv4 ones (dualstack.go).
	tunnels   [ipfamily.N]netip.Prefix
	byID      map[string]*Lease
	byAddr    map[netip.Addr]*Lease
	byKey     map[[32]byte]*Lease
	byBlock   map[int]*Lease
	next      netip.Addr // where the next address search starts
	nextBlock int        // where the next block search starts
}

// New returns a Manager for prefix, never handing out the network address,
// the gateway's own address or (for IPv4) the broadcast address. A lease
// lives ttl after its start or last renewal. If blocks > 0 every lease also
// gets one of that many egress port blocks, and joins fail with
// ErrNoPortBlock when all are taken.
func New(prefix netip.Prefix, gateway netip.Addr, ttl time.Duration, blocks int) (*Manager, error) {
	return NewStride(prefix, gateway, ttl, blocks, 1)
}

// NewStride is New for blocks that jobs may hold several of (AllocateRun):
// the blocks of one run are stride apart, and a run never extends past the
// last block.
func NewStride(prefix netip.Prefix, gateway netip.Addr, ttl time.Duration, blocks, stride int) (*Manager, error) {
	prefix = prefix.Masked()
	if !prefix.Contains(gateway) {
		return nil, fmt.Errorf("lease manager: gateway %s outside subnet %s", gateway, prefix)
	}
	if prefix.Bits() > prefix.Addr().BitLen()-2 {
		return nil, fmt.Errorf("lease manager: subnet %s too small", prefix)
	}
	if ttl <= 0 {
		return nil, fmt.Errorf("lease manager: ttl %v must be positive", ttl)
	}
	if blocks < 0 {
		return nil, fmt.Errorf("lease manager: %d port blocks", blocks)
	}
	if stride < 1 {
		return nil, fmt.Errorf("lease manager: block stride %d", stride)
	}
	m := &Manager{
		prefix:  prefix,
		gateway: gateway,
		ttl:     ttl,
		byID:    make(map[string]*Lease),
		byAddr:  make(map[netip.Addr]*Lease),
		byKey:   make(map[[32]byte]*Lease),
		byBlock: make(map[int]*Lease),
		next:    prefix.Addr().Next(),
		blocks:  blocks,
		stride:  stride,
	}
	m.tunnels[ipfamily.Of(prefix.Addr()).Index] = prefix
	return m, nil
}

// Addr returns the lease's first tunnel address, the one the Manager
// allocates (the zero Addr for a lease without addresses).
func (l Lease) Addr() netip.Addr {
	if len(l.Addrs) == 0 {
		return netip.Addr{}
	}
	return l.Addrs[0].Addr()
}

// AddrOf returns the lease's tunnel address of family f, the zero Addr
// for none.
func (l Lease) AddrOf(f *ipfamily.Family) netip.Addr {
	for _, p := range l.Addrs {
		if f.Contains(p.Addr()) {
			return p.Addr()
		}
	}
	return netip.Addr{}
}

// AddrList returns the lease's tunnel addresses without prefix lengths.
func (l Lease) AddrList() []netip.Addr {
	out := make([]netip.Addr, len(l.Addrs))
	for i, p := range l.Addrs {
		out[i] = p.Addr()
	}
	return out
}

// addrsLocked returns the tunnel addresses of the job at a, the address
// the Manager allocates, IPv4 first: a, and the address of every other
// tunnel prefix that embeds it.
func (m *Manager) addrsLocked(a netip.Addr) []netip.Prefix {
	out := make([]netip.Prefix, 0, ipfamily.N)
	for _, p := range m.tunnels {
		switch {
		case !p.IsValid():
		case p == m.prefix:
			out = append(out, netip.PrefixFrom(a, p.Bits()))
		default:
			out = append(out, netip.PrefixFrom(Embed6(p, a), p.Bits()))
		}
	}
	return out
}

// TTL returns how long a lease lives without renewal.
func (m *Manager) TTL() time.Duration { return m.ttl }

func (m *Manager) usable(a netip.Addr) bool {
	if !m.prefix.Contains(a) || a == m.prefix.Addr() || a == m.gateway {
		return false
	}
	if a.Is4() && a == lastAddr(m.prefix) {
		return false
	}
	return true
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Allocate makes a lease for the job with WireGuard public key pub. A live
// lease held by the same key is replaced (and returned as replaced so the
// caller can undo its side effects). The secret is returned once; only its
// hash is kept.
func (m *Manager) Allocate(pub [32]byte, owner identity.Job, now time.Time) (l Lease, secret string, replaced *Lease, err error) {
	return m.AllocateRun(pub, owner, now, 1)
}

// AllocateRun is Allocate for a job that holds n port blocks (a run,
// runs.go); without port blocks n is ignored. It fails with
// ErrNoPortBlock when no run of n free blocks exists.
func (m *Manager) AllocateRun(pub [32]byte, owner identity.Job, now time.Time, n int) (l Lease, secret string, replaced *Lease, err error) {
	if n < 1 {
		return Lease{}, "", nil, fmt.Errorf("lease manager: a run of %d port blocks", n)
	}
	id, err := randomString(12)
	if err != nil {
		return Lease{}, "", nil, err
	}
	secret, err = randomString(24)
	if err != nil {
		return Lease{}, "", nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if old, ok := m.byKey[pub]; ok {
		o := *old
		replaced = &o
		m.removeLocked(old)
	}
	addr, ok := m.findFreeLocked()
	if !ok {
		return Lease{}, "", replaced, ErrNoAddress
	}
	block, blocks := -1, 0
	if m.blocks > 0 {
		if block, ok = m.findFreeRunLocked(n); !ok {
			return Lease{}, "", replaced, ErrNoPortBlock
		}
		blocks = n
	}
	nl := &Lease{
		ID:         id,
		Addrs:      m.addrsLocked(addr),
		Block:      block,
		Blocks:     blocks,
		PublicKey:  pub,
		Owner:      owner,
		Start:      now,
		Expires:    now.Add(m.ttl),
		secretHash: sha256.Sum256([]byte(secret)),
	}
	m.byID[id] = nl
	m.byAddr[addr] = nl
	m.byKey[pub] = nl
	m.holdRunLocked(nl)
	return *nl, secret, replaced, nil
}

// findFreeLocked walks the subnet from m.next, wrapping once, so that a freed
// address is reused as late as possible (which keeps attribution simple).
func (m *Manager) findFreeLocked() (netip.Addr, bool) {
	a := m.next
	for wrapped := false; ; {
		if !m.prefix.Contains(a) {
			if wrapped {
				return netip.Addr{}, false
			}
			wrapped = true
			a = m.prefix.Addr()
		}
		if m.usable(a) && m.byAddr[a] == nil {
			m.next = a.Next()
			return a, true
		}
		a = a.Next()
		if wrapped && a == m.next {
			return netip.Addr{}, false
		}
	}
}

func (m *Manager) lookupLocked(id, secret string) (*Lease, error) {
	l, ok := m.byID[id]
	if !ok {
		return nil, ErrUnknownLease
	}
	h := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(h[:], l.secretHash[:]) != 1 {
		return nil, ErrUnknownLease
	}
	return l, nil
}

// Renew extends the lease by the TTL from now.
func (m *Manager) Renew(id, secret string, now time.Time) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.lookupLocked(id, secret)
	if err != nil {
		return Lease{}, err
	}
	if now.After(l.Expires) {
		m.removeLocked(l)
		return Lease{}, ErrUnknownLease
	}
	l.Expires = now.Add(m.ttl)
	return *l, nil
}

// Release ends the lease and frees its address.
func (m *Manager) Release(id, secret string) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.lookupLocked(id, secret)
	if err != nil {
		return Lease{}, err
	}
	m.removeLocked(l)
	return *l, nil
}

func (m *Manager) removeLocked(l *Lease) {
	delete(m.byID, l.ID)
	delete(m.byAddr, l.Addr())
	for _, b := range m.run(*l) {
		if m.byBlock[b] == l {
			delete(m.byBlock, b)
		}
	}
	if m.byKey[l.PublicKey] == l {
		delete(m.byKey, l.PublicKey)
	}
}

// Expire removes and returns every lease whose expiry is before now.
func (m *Manager) Expire(now time.Time) []Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Lease
	for _, l := range m.byID {
		if now.After(l.Expires) {
			out = append(out, *l)
			m.removeLocked(l)
		}
	}
	return out
}

// Leases returns a snapshot of the live leases ordered by address.
func (m *Manager) Leases() []Lease {
	m.mu.Lock()
	out := make([]Lease, 0, len(m.byID))
	for _, l := range m.byID {
		out = append(out, *l)
	}
	m.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
}

// Len returns the number of live leases.
func (m *Manager) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.byID)
}

func randomString(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("random: %w", err)
	}
	if n <= 12 {
		return hex.EncodeToString(b), nil
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// ByID returns the live lease with id (expired but not yet swept too).
func (m *Manager) ByID(id string) (Lease, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.byID[id]
	if !ok {
		return Lease{}, false
	}
	return *l, true
}

// SecretHash returns the SHA-256 of l's secret, for persisting the lease.
func (l Lease) SecretHash() [32]byte { return l.secretHash }

// Check returns the live lease that id and secret name, or ErrUnknownLease.
// An expired lease is not live.
func (m *Manager) Check(id, secret string, now time.Time) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.lookupLocked(id, secret)
	if err != nil {
		return Lease{}, err
	}
	if now.After(l.Expires) {
		return Lease{}, ErrUnknownLease
	}
	return *l, nil
}

// Restore puts back a lease that a previous run of the gateway handed out
// (l with the hash of its secret), for example after a restart, and
// returns it as restored, with all its addresses. l needs only its first
// address (Addr); the others are derived again. It fails if that address
// is not usable in this subnet, its block does not exist, or either (or
// its id or key) is already taken.
func (m *Manager) Restore(l Lease, secretHash [32]byte) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	a := l.Addr().Unmap()
	switch {
	case !m.usable(a):
		return Lease{}, fmt.Errorf("restore lease %s: address %s not usable in %s", l.ID, a, m.prefix)
	case !m.runExistsLocked(l):
		return Lease{}, fmt.Errorf("restore lease %s: port blocks %d (%d of them, %d apart) do not exist (%d blocks)", l.ID, l.Block, l.Blocks, m.stride, m.blocks)
	case m.byID[l.ID] != nil || m.byAddr[a] != nil || m.byKey[l.PublicKey] != nil:
		return Lease{}, fmt.Errorf("restore lease %s: id, address or key already leased", l.ID)
	case !m.runFreeLocked(l.Block, max(l.Blocks, 1)):
		return Lease{}, fmt.Errorf("restore lease %s: port block %d already leased", l.ID, l.Block)
	}
	nl := l
	nl.secretHash = secretHash
	nl.Addrs = m.addrsLocked(a)
	if nl.Block >= 0 && nl.Blocks == 0 {
		nl.Blocks = 1
	}
	m.byID[nl.ID] = &nl
	m.byAddr[a] = &nl
	m.byKey[nl.PublicKey] = &nl
	m.holdRunLocked(&nl)
	if nl.Block >= 0 && nl.Block >= m.nextBlock {
		m.nextBlock = (nl.Block + 1) % m.blocks
	}
	if m.next.Less(a.Next()) {
		m.next = a.Next()
	}
	return nl, nil
}

// Reown replaces the owner of the live lease id and secret name with
// what update returns for the current one (under the manager's lock: an
// update sees every earlier one), or returns ErrUnknownLease, or update's
// error.
func (m *Manager) Reown(id, secret string, now time.Time, update func(owner identity.Job) (identity.Job, error)) (Lease, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, err := m.lookupLocked(id, secret)
	if err != nil {
		return Lease{}, err
	}
	if now.After(l.Expires) {
		return Lease{}, ErrUnknownLease
	}
	o, err := update(l.Owner)
	if err != nil {
		return Lease{}, err
	}
	l.Owner = o
	return *l, nil
}
