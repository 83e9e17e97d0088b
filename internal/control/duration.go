// SPDX-License-Identifier: MIT

package control

import (
	"encoding/json"
	"fmt"
	"time"
)

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String formats d like time.Duration, e.g. "30s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalJSON encodes d as a JSON string such as "30s".
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON decodes a JSON string accepted by time.ParseDuration, such as
// "30s" or "1m30s". Numbers are rejected because their unit is ambiguous.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration: want a string such as \"30s\", got %.40s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration: %w", err)
	}
	*d = Duration(v)
	return nil
}
