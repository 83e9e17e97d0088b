// SPDX-License-Identifier: MIT

// Package impair is the engine of the test harness's WAN impairment relay:
// per direction, it decides for every packet whether it is lost and when it
// leaves, adding one-way delay with jitter, random loss, Gilbert–Elliott
// burst loss, reordering and a rate cap with a bounded drop-tail queue.
//
// This kernel has no netem, so test/topology places a relay (Relay, in
// relay_linux.go) in a middle namespace between cn and dmz that bridges two
// veth links with AF_PACKET sockets and asks a Shaper what to do with each
// frame. The Shaper is pure: it takes the current time as an argument and
// draws from its own PRNG seeded from Config.Seed, so the same seed and the
// same packet sequence give the same decisions (a failing test replays with
// its logged seed), and unit tests drive it with a fake clock.
package impair

import (
	"errors"
	"fmt"
	"time"
)

// Config is the impairment of both directions. The zero value forwards
// every packet at once, unchanged.
type Config struct {
	// Seed seeds the PRNGs (one per direction). The harness picks a
	// random one when it is 0 and logs it.
	Seed uint64 `json:"seed"`
	// Up is the compute node → gateway direction (cn → dmz), Down the
	// reverse.
	Up   Dir `json:"up"`
	Down Dir `json:"down"`
}

// Dir is the impairment of one direction. The zero value is transparent.
type Dir struct {
	// Delay is the one-way delay added to every packet, Jitter the half
	// width of a uniform variation around it (Delay±Jitter, at least 0).
	// Jitter never reorders: a packet leaves no earlier than the one
	// before it, as on a real link; reordering is Reorder's.
	Delay  time.Duration `json:"delay"`
	Jitter time.Duration `json:"jitter"`

	// Loss is the probability that a packet is lost, independently of
	// the others.
	Loss float64 `json:"loss"`
	// Burst, if non-nil, adds Gilbert–Elliott burst loss.
	Burst *GilbertElliott `json:"burst,omitempty"`

	// Reorder is the probability that a packet skips Delay and leaves as
	// soon as the rate allows, overtaking the packets still being delayed
	// (netem's reorder). It has an effect only with Delay > 0.
	Reorder float64 `json:"reorder"`

	// Rate caps the direction at this many bits per second (0: no cap):
	// packets are serialised one after another at Rate, waiting in a
	// drop-tail queue of at most QueueBytes (0: DefaultQueueBytes).
	Rate       int64 `json:"rate"`
	QueueBytes int   `json:"queue_bytes"`
}

// GilbertElliott is a two-state Markov loss model. Before each packet the
// chain moves Good → Bad with probability P and Bad → Good with probability
// R; the packet is then lost with probability LossGood in the good state,
// LossBad in the bad state. With LossGood 0 and LossBad 1, loss bursts are
// geometric with mean length 1/R and the long-run loss rate is P/(P+R).
type GilbertElliott struct {
	P        float64 `json:"p"`
	R        float64 `json:"r"`
	LossGood float64 `json:"loss_good"`
	LossBad  float64 `json:"loss_bad"`
}

// DefaultQueueBytes is the rate queue's limit when Dir.QueueBytes is 0.
const DefaultQueueBytes = 1 << 20

// Symmetric returns a Config that delays each direction by rtt/2 and loses
// loss (a probability) of the packets in each.
func Symmetric(rtt time.Duration, loss float64) Config {
	d := Dir{Delay: rtt / 2, Loss: loss}
	return Config{Up: d, Down: d}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	if err := c.Up.validate(); err != nil {
		return fmt.Errorf("up: %w", err)
	}
	if err := c.Down.validate(); err != nil {
		return fmt.Errorf("down: %w", err)
	}
	return nil
}

func (d Dir) validate() error {
	prob := func(name string, p float64) error {
		if !(p >= 0 && p <= 1) {
			return fmt.Errorf("%s %v: want a probability in [0, 1]", name, p)
		}
		return nil
	}
	if d.Delay < 0 || d.Jitter < 0 {
		return errors.New("negative delay or jitter")
	}
	if err := prob("loss", d.Loss); err != nil {
		return err
	}
	if err := prob("reorder", d.Reorder); err != nil {
		return err
	}
	if d.Rate < 0 || d.QueueBytes < 0 {
		return errors.New("negative rate or queue size")
	}
	if b := d.Burst; b != nil {
		for _, f := range []struct {
			n string
			p float64
		}{{"burst p", b.P}, {"burst r", b.R}, {"burst loss_good", b.LossGood}, {"burst loss_bad", b.LossBad}} {
			if err := prob(f.n, f.p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Impaired reports whether the direction changes anything.
func (d Dir) Impaired() bool {
	return d.Delay > 0 || d.Jitter > 0 || d.Loss > 0 || d.Burst != nil || d.Reorder > 0 || d.Rate > 0
}

// String is a short description for logs and test names.
func (c Config) String() string {
	return fmt.Sprintf("seed=%d up{%s} down{%s}", c.Seed, c.Up, c.Down)
}

func (d Dir) String() string {
	s := fmt.Sprintf("delay=%v", d.Delay)
	if d.Jitter > 0 {
		s += fmt.Sprintf(" jitter=%v", d.Jitter)
	}
	if d.Loss > 0 {
		s += fmt.Sprintf(" loss=%g%%", d.Loss*100)
	}
	if b := d.Burst; b != nil {
		s += fmt.Sprintf(" ge(p=%g r=%g good=%g bad=%g)", b.P, b.R, b.LossGood, b.LossBad)
	}
	if d.Reorder > 0 {
		s += fmt.Sprintf(" reorder=%g%%", d.Reorder*100)
	}
	if d.Rate > 0 {
		s += fmt.Sprintf(" rate=%dbit/s", d.Rate)
	}
	return s
}
