// SPDX-License-Identifier: MIT

package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/airlock-vpn/airlock/internal/control"
	"github.com/airlock-vpn/airlock/internal/httpjson"
)

// RotateKeyRequest is the body of POST /v1/rotate-key: start a rotation of
// the gateway's TLS key (control/rotate.go), or finish one.
type RotateKeyRequest struct {
	Finish bool `json:"finish"`
}

// RotateKeyResult says where a rotation stands: the pins clients must
// accept (join.env's AIRLOCK_PIN), the current one and, while a rotation
// is under way, the next one, and how many TLS handshakes presented each
// identity since the gateway started (airlock_tls_handshakes_total).
type RotateKeyResult struct {
	Pin        string            `json:"pin"`
	Current    string            `json:"current"`
	Next       string            `json:"next,omitempty"`
	Handshakes map[string]uint64 `json:"handshakes,omitempty"`
}

// RotateKeyPath is the admin endpoint of airlock gateway rotate-key.
const RotateKeyPath = "/v1/rotate-key"

// codeRotation answers a rotation step that does not fit the state.
const codeRotation = "key_rotation"

// KeyRotator is the part of a running gateway that rotates its TLS key;
// SetKeyRotator registers it.
type KeyRotator interface {
	// RotateKey starts (finish false) or finishes a key rotation in the
	// state directory, puts it in force for new TLS handshakes and
	// rewrites join.env. Errors wrap control.ErrRotation when the step
	// does not fit the state directory.
	RotateKey(finish bool) (RotateKeyResult, error)
}

// SetKeyRotator registers POST /v1/rotate-key, answered by k.
func (s *Server) SetKeyRotator(k KeyRotator) {
	s.mux.HandleFunc("POST "+RotateKeyPath, func(w http.ResponseWriter, r *http.Request) {
		var req RotateKeyRequest
		if err := decodeBody(w, r, &req); err != nil {
			httpjson.Write(w, http.StatusBadRequest, errorBody{Code: codeBadRequest, Message: "rotate-key: want {\"finish\": true|false}: " + err.Error()})
			return
		}
		res, err := k.RotateKey(req.Finish)
		switch {
		case errors.Is(err, control.ErrRotation):
			httpjson.Write(w, http.StatusConflict, errorBody{Code: codeRotation, Message: err.Error()})
		case err != nil:
			httpjson.Write(w, http.StatusInternalServerError, errorBody{Code: codeInternal, Message: err.Error()})
		default:
			s.log.Warn("gateway TLS key rotation", "finish", req.Finish, "pin", res.Pin)
			httpjson.Write(w, http.StatusOK, res)
		}
	})
}

// RotateKey asks the running gateway to start or finish a key rotation.
func (c *Client) RotateKey(ctx context.Context, finish bool) (RotateKeyResult, error) {
	var res RotateKeyResult
	if err := c.do(ctx, http.MethodPost, RotateKeyPath, RotateKeyRequest{Finish: finish}, &res); err != nil {
		return RotateKeyResult{}, err
	}
	return res, nil
}
