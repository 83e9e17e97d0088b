// SPDX-License-Identifier: MIT

//go:build !linux

package control

import "errors"

// idleWaiter is epoll-based (idle_linux.go); elsewhere every session
// keeps a goroutine blocked reading its connection.
type idleWaiter struct{}

func newIdleWaiter() (*idleWaiter, error) { return nil, errors.New("no epoll") }

func (w *idleWaiter) add(ss *serverSession) error       { return errors.New("no epoll") }
func (w *idleWaiter) armLocked(ss *serverSession) error { return errors.New("no epoll") }
func (w *idleWaiter) remove(ss *serverSession)          {}
func (w *idleWaiter) close()                            {}
