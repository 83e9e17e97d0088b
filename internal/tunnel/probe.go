// SPDX-License-Identifier: MIT

package tunnel

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"golang.zx2c4.com/wireguard/conn"
)

// Path MTU probe, theory of operation. In user mode the gateway ends the
// job's TCP, so the tunnel need not fit the Internet's 1500 bytes: where
// node and gateway share 9000-byte frames, the job's TUN can take
// 8,9xx-byte packets. The gateway offers a larger MTU in the lease
// (control.Lease.MaxMTU) with a probe token; before the job's TUN is made,
// the client sends a probe to the gateway's WireGuard UDP port padded to
// the size that a full tunnel packet would have on the wire, with DF set,
// and takes the larger MTU only if the gateway's equally padded reply
// comes back: both directions carried a datagram of that size. A path
// that drops big frames silently (a middlebox, a mismatched link) gives no
// reply, and the client keeps the lease's MTU (1420): no flow can hang on
// packets that never arrive.
//
// A probe is not a WireGuard message (its first byte is probeMagic[0],
// not a message type 1-4): wireguard-go drops it after the Bind has
// answered it. A reply is never larger than its request (no
// amplification), answers are rate-limited, and only a request that
// carries a token the gateway made (ProbeToken, given with the lease over
// the TLS control channel) and that has not expired is answered.
//
// Wire format (all of it padded with zeros to the probed size):
//
//	request: magic[4] kind=1 0 0 0 nonce[8] expiry[8] mac[16]
//	reply:   magic[4] kind=2 0 0 0 nonce[8]

// WireGuard's per-packet overhead on the wire, besides the IP header: UDP
// header 8, data message header 16, Poly1305 tag 16.
const wgOverhead = 8 + 16 + 16

// Overhead returns the bytes a tunnel packet adds on the wire for an
// endpoint of the family of a: IP header, UDP and WireGuard's data
// message framing (60 for IPv4, 80 for IPv6).
func Overhead(a netip.Addr) int {
	if a.Unmap().Is4() {
		return 20 + wgOverhead
	}
	return 40 + wgOverhead
}

var probeMagic = [4]byte{0xa1, 'm', 't', 'u'}

const (
	probeRequest = 1
	probeReply   = 2
	// probeTokenLen is a token's length: expiry (8) and MAC (16).
	probeTokenLen = 24
	// probeReqLen is the smallest request; probeReplyLen the smallest reply.
	probeReqLen   = 16 + probeTokenLen
	probeReplyLen = 16
	// ProbeTokenTTL is how long a probe token is valid.
	ProbeTokenTTL = 10 * time.Minute
	// probeRate and probeBurst bound the replies a gateway sends.
	probeRate  = 200 // per second
	probeBurst = 100
)

// ProbeKey makes and checks probe tokens. The zero value is not usable;
// make one with NewProbeKey. It is safe for concurrent use.
type ProbeKey struct {
	key [32]byte
}

// NewProbeKey returns a random key.
func NewProbeKey() (*ProbeKey, error) {
	var k ProbeKey
	if _, err := rand.Read(k.key[:]); err != nil {
		return nil, fmt.Errorf("probe key: %w", err)
	}
	return &k, nil
}

// Token returns a probe token that expires ProbeTokenTTL after now.
func (k *ProbeKey) Token(now time.Time) []byte {
	tok := make([]byte, probeTokenLen)
	binary.BigEndian.PutUint64(tok, uint64(now.Add(ProbeTokenTTL).Unix()))
	copy(tok[8:], k.mac(tok[:8]))
	return tok
}

func (k *ProbeKey) mac(expiry []byte) []byte {
	m := hmac.New(sha256.New, k.key[:])
	m.Write([]byte("airlock mtu probe"))
	m.Write(expiry)
	return m.Sum(nil)[:16]
}

// valid reports whether tok is a token of k that has not expired at now.
func (k *ProbeKey) valid(tok []byte, now time.Time) bool {
	if len(tok) != probeTokenLen {
		return false
	}
	if int64(binary.BigEndian.Uint64(tok)) < now.Unix() {
		return false
	}
	return hmac.Equal(tok[8:], k.mac(tok[:8]))
}

// isProbe reports whether p is shaped like a probe message of kind.
func isProbe(p []byte, kind byte) bool {
	return len(p) >= probeReplyLen && [4]byte(p[:4]) == probeMagic && p[4] == kind
}

// prober answers probes on a gateway's Bind.
type prober struct {
	key *ProbeKey
	now func() time.Time

	mu     sync.Mutex
	tokens float64   // guarded by mu: the rate limit's bucket
	last   time.Time // guarded by mu: when the bucket was last filled
	// answered and refused count probes (guarded by mu).
	answered, refused uint64
}

// allowLocked takes one reply from the bucket.
func (p *prober) allowLocked(now time.Time) bool {
	p.tokens = min(probeBurst, p.tokens+now.Sub(p.last).Seconds()*probeRate)
	p.last = now
	if p.tokens < 1 {
		return false
	}
	p.tokens--
	return true
}

// reply returns the reply to request req, or nil if it must not be
// answered (bad or expired token, over the rate).
func (p *prober) reply(req []byte) []byte {
	now := p.now()
	ok := len(req) >= probeReqLen && p.key.valid(req[16:16+probeTokenLen], now)
	p.mu.Lock()
	ok = ok && p.allowLocked(now)
	if ok {
		p.answered++
	} else {
		p.refused++
	}
	p.mu.Unlock()
	if !ok {
		return nil
	}
	r := make([]byte, len(req))
	copy(r, probeMagic[:])
	r[4] = probeReply
	copy(r[8:16], req[8:16])
	return r
}

// AnswerProbes makes the bind answer path MTU probes that carry a token
// of key (see the theory of operation above). Call it before Open.
func (b *Bind) AnswerProbes(key *ProbeKey) {
	b.probe = &prober{key: key, now: time.Now, tokens: probeBurst, last: time.Now()}
}

// ProbeCounts returns how many probes the bind answered and refused.
func (b *Bind) ProbeCounts() (answered, refused uint64) {
	if b.probe == nil {
		return 0, 0
	}
	b.probe.mu.Lock()
	defer b.probe.mu.Unlock()
	return b.probe.answered, b.probe.refused
}

// answerProbe answers p if it is a probe request; wireguard-go drops it
// afterwards (not a WireGuard message type).
func (b *Bind) answerProbe(p []byte, ep conn.Endpoint) {
	if b.probe == nil || !isProbe(p, probeRequest) {
		return
	}
	if r := b.probe.reply(p); r != nil {
		if err := b.udp.Send([][]byte{r}, ep); err != nil {
			b.log.Debug("answer mtu probe", "to", ep.DstToString(), "size", len(r), "err", err)
		}
	}
}

// ProbeConfig is what ProbeMTU needs.
type ProbeConfig struct {
	// Endpoint is the gateway's WireGuard UDP endpoint.
	Endpoint netip.AddrPort
	// Token is the lease's probe token.
	Token []byte
	// Max is the largest tunnel MTU the gateway offers; Fallback the MTU
	// to keep when the larger one cannot be proven (the lease's).
	Max, Fallback int
	// Wait bounds the whole probe (0: 600 ms); Resend is the interval
	// between tries (0: 100 ms).
	Wait, Resend time.Duration
}

// ErrProbeUnanswered is ProbeMTU's error when no reply to the large probe
// came back in time: something on the path drops big datagrams (or UDP).
var ErrProbeUnanswered = errors.New("no reply to the path mtu probe")

// ProbeMTU returns the tunnel MTU to use towards the gateway: the largest
// of cfg.Max and what the local route to the gateway allows (its MTU less
// Overhead), if a probe of that size goes to the gateway and its reply
// comes back; otherwise cfg.Fallback, with an error that says why. It
// sends probes and a small one of the fallback's size alongside (to tell a
// path that drops big datagrams from one that drops UDP) every
// cfg.Resend, with DF set, until the big reply arrives or cfg.Wait has
// passed (at most three resends once the small reply came).
func ProbeMTU(ctx context.Context, cfg ProbeConfig) (int, error) {
	if cfg.Wait <= 0 {
		cfg.Wait = 600 * time.Millisecond
	}
	if cfg.Resend <= 0 {
		cfg.Resend = 100 * time.Millisecond
	}
	if cfg.Max <= cfg.Fallback || len(cfg.Token) != probeTokenLen {
		return cfg.Fallback, nil
	}
	ep := netip.AddrPortFrom(cfg.Endpoint.Addr().Unmap(), cfg.Endpoint.Port())
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(ep))
	if err != nil {
		return cfg.Fallback, fmt.Errorf("probe path mtu to %s: %w", ep, err)
	}
	defer c.Close()
	path, err := dontFragment(c, ep.Addr().Is4())
	if err != nil {
		return cfg.Fallback, fmt.Errorf("probe path mtu to %s: %w", ep, err)
	}
	want := min(cfg.Max, path-Overhead(ep.Addr()))
	if want <= cfg.Fallback {
		return cfg.Fallback, nil
	}
	var nonce [8]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		return cfg.Fallback, fmt.Errorf("probe nonce: %w", err)
	}
	mk := func(mtu int) []byte {
		p := make([]byte, mtu+wgOverhead-8) // the UDP payload of a full packet
		copy(p, probeMagic[:])
		p[4] = probeRequest
		copy(p[8:16], nonce[:])
		copy(p[16:], cfg.Token)
		return p
	}
	big, small := mk(want), mk(cfg.Fallback)
	ctx, cancel := context.WithTimeout(ctx, cfg.Wait)
	defer cancel()
	type got struct{ size int }
	replies := make(chan got, 16)
	go func() {
		buf := make([]byte, len(big)+1)
		for {
			n, err := c.Read(buf)
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue // e.g. ECONNREFUSED from an earlier send's ICMP
			}
			if isProbe(buf[:n], probeReply) && [8]byte(buf[8:16]) == nonce {
				select {
				case replies <- got{n}:
				default:
				}
			}
		}
	}()
	tick := time.NewTicker(cfg.Resend)
	defer tick.Stop()
	smallSeen, left := false, -1
	for {
		if _, err := c.Write(big); err != nil {
			if errors.Is(err, unix.EMSGSIZE) {
				return cfg.Fallback, fmt.Errorf("probe path mtu %d to %s: %w (the route's mtu is smaller)", want, ep, err)
			}
		}
		if !smallSeen {
			c.Write(small) //nolint:errcheck // a lost small probe only slows the fall back
		}
		if left > 0 {
			left--
		}
		for again := true; again; {
			select {
			case <-ctx.Done():
				if smallSeen {
					return cfg.Fallback, fmt.Errorf("%w of %d bytes from %s (the %d-byte one was answered): big datagrams are dropped on the path", ErrProbeUnanswered, len(big), ep, len(small))
				}
				return cfg.Fallback, fmt.Errorf("%w from %s (UDP to the gateway may be blocked)", ErrProbeUnanswered, ep)
			case r := <-replies:
				if r.size == len(big) {
					return want, nil
				}
				if !smallSeen {
					smallSeen, left = true, 3
				}
			case <-tick.C:
				if left == 0 {
					return cfg.Fallback, fmt.Errorf("%w of %d bytes from %s (the %d-byte one was answered): big datagrams are dropped on the path", ErrProbeUnanswered, len(big), ep, len(small))
				}
				again = false
			}
		}
	}
}

// dontFragment sets DF on c's datagrams (no fragmentation; EMSGSIZE above
// the route's MTU) and returns the route's MTU towards c's peer.
func dontFragment(c *net.UDPConn, v4 bool) (int, error) {
	sc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var mtu int
	var serr error
	err = sc.Control(func(fd uintptr) {
		if v4 {
			if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO); serr == nil {
				mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_MTU)
			}
			return
		}
		if serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO); serr == nil {
			mtu, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_MTU)
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return 0, fmt.Errorf("set DF and read the route's mtu: %w", err)
	}
	return mtu, nil
}

// RouteMTU returns the MTU of the local route towards a (the interface's,
// or the route's own mtu attribute), as the kernel would use for a
// datagram to it.
func RouteMTU(a netip.Addr) (int, error) {
	a = a.Unmap()
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, 9)))
	if err != nil {
		return 0, fmt.Errorf("route to %s: %w", a, err)
	}
	defer c.Close()
	return dontFragment(c, a.Is4())
}
