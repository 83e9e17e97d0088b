// SPDX-License-Identifier: MIT

package control

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds of the text fields of a JobInfo, in bytes. A join whose fields
// exceed them, or carry anything but printable characters, is refused
// (CodeBadRequest): they end up in logs, the lease history and admins'
// terminals.
const (
	MaxBatchJobID  = 128
	MaxBatchSystem = 32
	MaxHostname    = 253
	MaxUser        = 64
	MaxCommand     = 256
)

// maxExpose bounds the ports one join may ask to expose.
const maxExpose = 64

// jobFields lists JobInfo's text fields with their JSON names and bounds.
func (j *JobInfo) jobFields() []struct {
	name string
	v    *string
	max  int
} {
	return []struct {
		name string
		v    *string
		max  int
	}{
		{"batch_job_id", &j.BatchJobID, MaxBatchJobID},
		{"batch_system", &j.BatchSystem, MaxBatchSystem},
		{"hostname", &j.Hostname, MaxHostname},
		{"user", &j.User, MaxUser},
		{"command", &j.Command, MaxCommand},
	}
}

// Validate reports the first field of j that a gateway refuses: text that
// is not valid UTF-8, holds a control, format or other non-printable
// character (only the ASCII space is allowed as white space), or is longer
// than its bound; or a uid outside 0..2³²-2.
func (j JobInfo) Validate() error {
	for _, f := range j.jobFields() {
		if err := checkText(*f.v, f.max); err != nil {
			return fmt.Errorf("job.%s: %w", f.name, err)
		}
	}
	if j.UID < 0 || int64(j.UID) > math.MaxUint32-1 {
		return fmt.Errorf("job.uid: %d is not a uid (want 0-%d)", j.UID, uint32(math.MaxUint32-1))
	}
	return nil
}

// Clean returns j with every field made acceptable to Validate: characters
// it refuses become '?', and text is cut to its bound at a character
// boundary. Clients use it on what they read from the environment.
func (j JobInfo) Clean() JobInfo {
	for _, f := range j.jobFields() {
		*f.v = cleanText(*f.v, f.max)
	}
	if j.UID < 0 || int64(j.UID) > math.MaxUint32-1 {
		j.UID = math.MaxUint32 - 1 // the overflow uid would be 65534; this says "none"
	}
	return j
}

// printable reports whether r may appear in a job field.
func printable(r rune) bool {
	return r == ' ' || unicode.IsPrint(r) && r != utf8.RuneError
}

func checkText(s string, max int) error {
	if len(s) > max {
		return fmt.Errorf("%d bytes, longer than the limit of %d", len(s), max)
	}
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for i, r := range s {
		if !printable(r) {
			return fmt.Errorf("character %U at byte %d is not printable (control, format or white-space characters other than space are refused)", r, i)
		}
	}
	return nil
}

func cleanText(s string, max int) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "?") {
		if !printable(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > max {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}
