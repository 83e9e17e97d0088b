// SPDX-License-Identifier: MIT

package client

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/nsexec"
)

// TestMain lets the test binary be the namespace child that
// prepareNetns starts (/proc/self/exe), as airlock's main does.
func TestMain(m *testing.M) {
	nsexec.Init()
	os.Exit(m.Run())
}

// TestPrepareNetnsHidesCredentials checks that the namespace child that
// airlock run starts while it joins (prepareNetns) holds none of airlock's
// credentials in its environment, which the user's other processes can
// read (/proc/PID/environ) until it execs the job; and that no child is
// started for a mode without a namespace.
func TestPrepareNetnsHidesCredentials(t *testing.T) {
	if err := nsexec.Preflight(); err != nil {
		t.Skipf("no user namespaces here: %v", err)
	}
	t.Setenv(envToken, "alk1_secret_of_the_test")
	t.Setenv(envTokenFile, "/run/secret-token-file")
	t.Setenv("AIRLOCK_TEST_KEEP", "kept")
	job, err := prepareNetns(Config{Args: []string{"true"}}, newPlan(ModeNetns)).wait()
	if err != nil {
		t.Fatalf("prepareNetns: %v", err)
	}
	defer job.Cleanup()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(job.Pid()) + "/environ")
	if err != nil {
		t.Fatalf("read the waiting child's environment: %v", err)
	}
	env := string(b)
	if strings.Contains(env, "alk1_secret_of_the_test") || strings.Contains(env, "secret-token-file") {
		t.Errorf("the waiting namespace child's environment holds a credential: %q", env)
	}
	if !strings.Contains(env, "AIRLOCK_TEST_KEEP=kept") {
		t.Errorf("the waiting namespace child's environment lacks the job's variables: %q", env)
	}
	if e := prepareNetns(Config{Args: []string{"true"}}, newPlan(ModeProxy)); e != nil {
		t.Errorf("prepareNetns for --mode proxy: got %v, want no child", e)
	}
}
