// SPDX-License-Identifier: MIT

package munge

import (
	"errors"
	"fmt"
	"syscall"
)

// Code is a MUNGE error number (munge_err_t).
type Code uint8

// MUNGE's error numbers.
const (
	SnafuCode        Code = 1
	BadArgCode       Code = 2
	BadLengthCode    Code = 3
	OverflowCode     Code = 4
	NoMemoryCode     Code = 5
	SocketCode       Code = 6
	TimeoutCode      Code = 7
	BadCredCode      Code = 8
	BadVersionCode   Code = 9
	BadCipherCode    Code = 10
	BadMACCode       Code = 11
	BadZipCode       Code = 12
	BadRealmCode     Code = 13
	InvalidCode      Code = 14
	ExpiredCode      Code = 15
	RewoundCode      Code = 16
	ReplayedCode     Code = 17
	UnauthorizedCode Code = 18
)

var codeNames = map[Code]string{
	SnafuCode: "internal error", BadArgCode: "invalid argument", BadLengthCode: "message too long",
	OverflowCode: "buffer overflow", NoMemoryCode: "out of memory", SocketCode: "socket error",
	TimeoutCode: "socket timeout", BadCredCode: "invalid credential format", BadVersionCode: "invalid credential version",
	BadCipherCode: "invalid cipher type", BadMACCode: "invalid MAC type", BadZipCode: "invalid compression type",
	BadRealmCode: "unrecognized security realm", InvalidCode: "invalid credential", ExpiredCode: "expired credential",
	RewoundCode: "rewound credential (encoded in the future: clock skew)", ReplayedCode: "replayed credential",
	UnauthorizedCode: "unauthorized credential decode",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("munge error %d", uint8(c))
}

// Error is an error munged reported, or that talking to it met. Compare
// with errors.Is against the sentinels below, which match by Code.
type Error struct {
	Code Code
	// Message is munged's own sentence, if it sent one.
	Message string
}

func newError(c Code, msg string) *Error { return &Error{Code: c, Message: msg} }

func (e *Error) Error() string {
	if e.Message == "" || e.Message == e.Code.String() {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Is reports whether target is an *Error with e's Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is.
var (
	// ErrSocket: munged could not be reached or answered out of
	// protocol.
	ErrSocket = &Error{Code: SocketCode}
	// ErrInvalid: the credential does not decode with this munged's key
	// (another key, or not a credential at all).
	ErrInvalid = &Error{Code: InvalidCode}
	// ErrExpired: older than its time-to-live.
	ErrExpired = &Error{Code: ExpiredCode}
	// ErrRewound: encoded in the future by this munged's clock.
	ErrRewound = &Error{Code: RewoundCode}
	// ErrReplayed: this munged decoded it before.
	ErrReplayed = &Error{Code: ReplayedCode}
	// ErrUnauthorized: the credential names another decoder.
	ErrUnauthorized = &Error{Code: UnauthorizedCode}
)

// IsBadCredential reports whether err says the credential itself is bad
// (malformed, another key, expired, rewound, replayed, not for us), as
// opposed to munged being unreachable or failing.
func IsBadCredential(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	switch e.Code {
	case BadCredCode, BadVersionCode, BadCipherCode, BadMACCode, BadZipCode, BadRealmCode,
		InvalidCode, ExpiredCode, RewoundCode, ReplayedCode, UnauthorizedCode:
		return true
	}
	return false
}

var errNoSuchFile = syscall.ENOENT
