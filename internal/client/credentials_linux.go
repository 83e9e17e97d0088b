// SPDX-License-Identifier: MIT

package client

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// hideFromJob makes this process non-dumpable, so that processes of the
// same uid (the job) can neither read its /proc/PID/environ, mem, maps or
// fds nor ptrace it. It must run after the namespace child is started:
// the uid map of a child cloned from a non-dumpable process cannot be
// written. The job itself is exec'd and so dumpable again.
func hideFromJob() error {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return fmt.Errorf("hide airlock's memory from the job: prctl(PR_SET_DUMPABLE): %w", err)
	}
	return nil
}
