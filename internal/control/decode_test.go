package control

import (
	"bytes"
	"strings"
	"testing"
)

const testKey = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA="

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
		{"short key", `{"token":"a","public_key":"AQID"}`, "32 bytes"},
		{"url base64 key", `{"token":"a","public_key":"` + strings.ReplaceAll(testKey, "/", "_") + `x"}`, "32 bytes"},
		{"zero key", `{"token":"a","public_key":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`, "all zero"},
		{"wrong type", `{"token":5,"public_key":"` + testKey + `"}`, "bad JSON"},
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
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeJoinRequest(bytes.NewReader(body))
		if err != nil {
			return
		}
		if req.Token == "" {
			t.Errorf("accepted request without token")
		}
		key, err := ParsePublicKey(req.PublicKey)
		if err != nil {
			t.Errorf("accepted request with invalid key %q: %v", req.PublicKey, err)
		}
		if key == [32]byte{} {
			t.Errorf("accepted zero key")
		}
	})
}
