// SPDX-License-Identifier: MIT

package control

import (
	"bytes"
	"strings"
	"testing"

	"github.com/airlock-vpn/airlock/internal/wgkey"
)

const testKey = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="

// testKeyValue is testKey parsed.
var testKeyValue, _ = wgkey.Parse(testKey)

func TestDecodeJoinRequest(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		wantErr string // substring; "" means success
	}{
		{"ok", `{"token":"alk1_x","public_key":"` + testKey + `","job":{"batch_job_id":"42","uid":1000}}`, ""},
		{"empty", ``, "empty body"},
		{"not json", `hello`, "bad JSON"},
		{"unknown field", `{"token":"a","public_key":"` + testKey + `","admin":true}`, "unknown field"},
		{"trailing", `{"token":"a","public_key":"` + testKey + `"} {}`, "data after"},
		{"no token", `{"public_key":"` + testKey + `"}`, "missing token"},
		{"no key", `{"token":"a"}`, "missing public_key"},
		{"short key", `{"token":"a","public_key":"AQID"}`, "32 bytes"},
		{"url base64 key", `{"token":"a","public_key":"` + strings.ReplaceAll(testKey, "/", "_") + `x"}`, "32 bytes"},
		{"zero key", `{"token":"a","public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`, "all zero"},
		{"wrong type", `{"token":5,"public_key":"` + testKey + `"}`, "bad JSON"},
		{"unicode ok", `{"token":"a","public_key":"` + testKey + `","job":{"user":"müller","command":"my job.sh","hostname":"cn-1.example"}}`, ""},
		{"escape in job id", `{"token":"a","public_key":"` + testKey + `","job":{"batch_job_id":"42\u001b[2J"}}`, "job.batch_job_id: character U+001B"},
		{"newline in user", `{"token":"a","public_key":"` + testKey + `","job":{"user":"root\nfake log line"}}`, "job.user: character U+000A"},
		{"tab in host", `{"token":"a","public_key":"` + testKey + `","job":{"hostname":"a\tb"}}`, "job.hostname"},
		{"bidi override in command", `{"token":"a","public_key":"` + testKey + `","job":{"command":"txt.\u202eexe"}}`, "job.command: character U+202E"},
		{"bad utf-8 batch system", "{\"token\":\"a\",\"public_key\":\"" + testKey + "\",\"job\":{\"batch_system\":\"\xff\"}}", "job.batch_system"},
		{"long job id", `{"token":"a","public_key":"` + testKey + `","job":{"batch_job_id":"` + strings.Repeat("9", MaxBatchJobID+1) + `"}}`, "longer than the limit of 128"},
		{"negative uid", `{"token":"a","public_key":"` + testKey + `","job":{"uid":-1}}`, "job.uid"},
		{"ports", `{"token":"a","public_key":"` + testKey + `","ports":1024}`, ""},
		{"negative ports", `{"token":"a","public_key":"` + testKey + `","ports":-1}`, "ports: -1"},
		{"too many ports", `{"token":"a","public_key":"` + testKey + `","ports":65536}`, "ports: 65536"},
		{"replace without secret", `{"token":"a","public_key":"` + testKey + `","replace":{"id":"x"}}`, "replace: missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeJoinRequest(strings.NewReader(tc.body))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want error containing %q", err, tc.wantErr)
			}
		})
	}
}

func FuzzDecodeJoinRequest(f *testing.F) {
	f.Add([]byte(`{"token":"alk1_x","public_key":"` + testKey + `","job":{"batch_job_id":"42","uid":1000}}`))
	f.Add([]byte(`{"token":"a","public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`))
	f.Add([]byte(`{"token":"a","public_key":"` + testKey + `"} {}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"job":{"uid":1e400}}`))
	f.Add([]byte(`{"public_key":"` + testKey + `","attest":{"munge":"MUNGE:abc:","munge_job":"MUNGE:def:"}}`))
	f.Add([]byte(`{"token":"a","public_key":"` + testKey + `","attest":{"munge":"MUNGE: x:"},"Attested":{"uid":0}}`))
	f.Add([]byte(`{"public_key":"` + testKey + `","bearer":"eyJh.eyJi.c2ln","Issued":{"issuer":"x","subject":"y"}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeJoinRequest(bytes.NewReader(body))
		if err != nil {
			return
		}
		if req.Token == "" && req.Attest == nil && req.Bearer == "" {
			t.Errorf("accepted request without token or credential")
		}
		if req.Attested != nil || req.Issued != nil {
			t.Errorf("an attestation or issuer-verified identity came from the wire: %+v %+v", req.Attested, req.Issued)
		}
		if b := req.Bearer; b != "" && (len(b) > MaxBearer || strings.Count(b, ".") != 2 || strings.ContainsAny(b, " \n\x00")) {
			t.Errorf("accepted a malformed bearer token %q", b)
		}
		if a := req.Attest; a != nil && (!strings.HasPrefix(a.Munge, "MUNGE:") || len(a.Munge) > maxCredential || strings.ContainsAny(a.Munge+a.MungeJob, " \n\x00")) {
			t.Errorf("accepted a malformed credential %q / %q", a.Munge, a.MungeJob)
		}
		if _, err := wgkey.Parse(req.PublicKey.String()); err != nil {
			t.Errorf("accepted request with invalid key %q: %v", req.PublicKey, err)
		}
		if err := req.Job.Validate(); err != nil {
			t.Errorf("accepted job fields that do not validate: %v", err)
		}
	})
}

// TestJobInfoClean checks that what a client cleans always validates and
// keeps what was fine.
func TestJobInfoClean(t *testing.T) {
	for _, ji := range []JobInfo{
		{BatchJobID: "42", User: "müller", Hostname: "cn1", Command: "job.sh", UID: 1000},
		{BatchJobID: "4\x1b[2J2", User: "a\nb", Hostname: "h\xffost", Command: strings.Repeat("ü", MaxCommand), UID: -5},
		{BatchSystem: strings.Repeat("x", 100), Command: "a\u202eb"},
	} {
		c := ji.Clean()
		if err := c.Validate(); err != nil {
			t.Errorf("Clean(%#v) = %#v does not validate: %v", ji, c, err)
		}
		if ji.Validate() == nil && c != ji {
			t.Errorf("Clean changed a valid JobInfo: %#v → %#v", ji, c)
		}
	}
}
