// SPDX-License-Identifier: MIT

// Package httpjson writes the JSON responses of Airlock's HTTP APIs (the
// control API and the admin socket): one JSON object and a newline, with
// Content-Type and Content-Length set.
package httpjson

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Write writes v as the response with status. A value that cannot be
// encoded (a programming error) is answered 500 with
// {"code":"internal","message":"encode response: ..."}, the error shape
// of both APIs.
func Write(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		}{"internal", "encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)+1))
	w.WriteHeader(status)
	w.Write(append(body, '\n'))
}
