// SPDX-License-Identifier: MIT

package config

import (
	"errors"
	"fmt"
)

// ErrAbsent is wrapped by Load's error when the file does not exist, as
// opposed to existing and being invalid.
var ErrAbsent = errors.New("config file does not exist")

// Error is a problem with one key of a config file. Error() reads
// "FILE:LINE: KEY: problem", the form editors and admins know.
type Error struct {
	// File is the file's path as given to Load.
	File string
	// Line is the 1-based line of the key (or of the table that lacks
	// it); 0 if unknown.
	Line int
	// Key is the dotted key path, e.g. "policy.rule[2].to"; array tables
	// are numbered from 1 in file order.
	Key string
	Err error
}

func (e *Error) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc = fmt.Sprintf("%s:%d", e.File, e.Line)
	}
	if e.Key == "" {
		return fmt.Sprintf("%s: %v", loc, e.Err)
	}
	return fmt.Sprintf("%s: %s: %v", loc, e.Key, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
