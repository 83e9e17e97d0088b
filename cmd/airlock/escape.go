// SPDX-License-Identifier: MIT

package main

import (
	"strconv"
	"unicode"
)

// human returns s as it may be shown on an admin's terminal: unchanged if
// every character is printable (the ASCII space is the only white space
// allowed), else Go-quoted, so that text a client sent (batch job id,
// user, host, command) can never move the cursor, rewrite the screen,
// reorder text (bidi controls) or break a table's columns.
func human(s string) string {
	for _, r := range s {
		if r != ' ' && !unicode.IsPrint(r) || r == unicode.ReplacementChar {
			return strconv.QuoteToGraphic(s)
		}
	}
	return s
}

// orDash is human(s), or "-" for an empty s.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return human(s)
}

// truncateArg bounds an argument echoed in an error.
func truncateArg(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
