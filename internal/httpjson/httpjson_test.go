// SPDX-License-Identifier: MIT

package httpjson

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	Write(rec, http.StatusCreated, map[string]int{"a": 1})
	if rec.Code != http.StatusCreated || rec.Body.String() != "{\"a\":1}\n" || rec.Header().Get("Content-Length") != "8" ||
		rec.Header().Get("Content-Type") != "application/json" {
		t.Errorf("got %d %q %v", rec.Code, rec.Body.String(), rec.Header())
	}
	rec = httptest.NewRecorder()
	Write(rec, http.StatusOK, func() {}) // cannot be encoded
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), `"code":"internal"`) {
		t.Errorf("unencodable value: got %d %q", rec.Code, rec.Body.String())
	}
}
