// SPDX-License-Identifier: MIT

package gateway

import (
	"context"
	"strings"
	"testing"
	"time"
)

// TestStartFails checks that Start returns Run's error when the gateway
// ends before it is ready.
func TestStartFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sg, err := Start(ctx, Config{StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "no logger") {
		t.Errorf("Start without a logger: got %v, %v, want the error that names it", sg, err)
	}
}
