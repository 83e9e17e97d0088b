// SPDX-License-Identifier: MIT

package gateway

import (
	"fmt"

	"github.com/airlock-vpn/airlock/internal/config"
	"github.com/airlock-vpn/airlock/internal/control"
)

// Block size per job: --block-size is the base block, the unit of the
// egress plan and the fewest ports a job gets. A join may ask for more
// (control.JoinRequest.Ports, `airlock run --ports N`), and so may its
// token's config ([quota.token.NAME] block_size, for joins that ask
// nothing); it then gets ⌈N/base⌉ consecutive base blocks of one egress
// address (internal/lease runs), up to --max-block-size. The lease
// history records the whole range, so whois and restore need nothing
// new; both egress modes take the job's range as they take one block.

// DefaultMaxBlockSize is --max-block-size's default, in ports (rounded up
// to whole base blocks and down to one address's range).
const DefaultMaxBlockSize = 1024

// planMaxBlock checks --max-block-size against the plan and returns the
// largest number of base blocks one job may hold.
func planMaxBlock(c Config, e egress) (int, error) {
	size, perAddr := e.plan.Size, e.plan.Blocks()
	if c.MaxBlockSize == 0 {
		return max(1, min(perAddr, (DefaultMaxBlockSize+size-1)/size)), nil
	}
	switch {
	case c.MaxBlockSize < size:
		return 0, fmt.Errorf("--max-block-size %d is below --block-size %d: want at least one block", c.MaxBlockSize, size)
	case c.MaxBlockSize%size != 0:
		return 0, fmt.Errorf("--max-block-size %d: want a multiple of --block-size %d (jobs get whole blocks)", c.MaxBlockSize, size)
	case c.MaxBlockSize/size > perAddr:
		return 0, fmt.Errorf("--max-block-size %d: more than the %d ports of --egress-ports %s in blocks of %d", c.MaxBlockSize, perAddr*size, e.plan.Range, size)
	}
	return c.MaxBlockSize / size, nil
}

// warnBlockSizes logs a warning for every token whose block_size the
// gateway would refuse (above --max-block-size): its jobs that ask for
// nothing cannot join. At start and on every reload.
func (a *admission) warnBlockSizes(q config.Quotas) {
	maxPorts := a.maxBlocks * a.g.egress.plan.Size
	check := func(key string, n int) {
		if n > maxPorts {
			a.g.log.Warn("a token's block_size is above --max-block-size: its jobs that do not ask for fewer ports (airlock run --ports) are refused",
				"key", key, "block_size", n, "max_block_size", maxPorts)
		}
	}
	check("quota.job.block_size", q.Job.BlockSize)
	for tok, tq := range q.Tokens {
		check("quota.token."+tok+".block_size", tq.BlockSize)
	}
}

// jobBlocks returns how many base blocks a join gets: the ports it asks
// for, else its token's block_size, else one block. Asking for more than
// --max-block-size allows is refused (control.ErrBadRequest) with a
// message naming the limit.
func (a *admission) jobBlocks(asked int, tok string, q config.Quota) (int, error) {
	size, maxPorts := a.g.egress.plan.Size, a.maxBlocks*a.g.egress.plan.Size
	want, from := asked, "the job asks for"
	if want == 0 {
		want, from = q.BlockSize, "token "+tok+"'s block_size asks for"
	}
	if want == 0 || size == 0 {
		return 1, nil
	}
	if want > maxPorts {
		hint := "run it with fewer --ports, or ask the gateway's admin to raise airlock gateway --max-block-size"
		if asked == 0 {
			hint = "ask the gateway's admin to lower quota.token." + tok + ".block_size or raise airlock gateway --max-block-size"
		}
		return 0, fmt.Errorf("%w: %s %d egress ports, more than this gateway's limit of %d per job (--max-block-size); %s",
			control.ErrBadRequest, from, want, maxPorts, hint)
	}
	return (want + size - 1) / size, nil
}
