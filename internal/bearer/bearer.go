// SPDX-License-Identifier: MIT

// Package bearer verifies the bearer tokens (JWTs of the WLCG and
// SciTokens profiles) that an experiment's token issuer gives its jobs,
// for a gateway that takes a job's identity from them.
//
// Theory of operation. The gateway trusts a configured list of issuers
// ([Issuer]: its URL, the audiences it accepts, the scopes and groups a
// job's token must carry). For each, a [Verifier] reads the issuer's
// OpenID discovery document (URL + "/.well-known/openid-configuration"),
// whose "issuer" must be the URL itself and whose "jwks_uri" must be
// https, and then the key set it names: both over TLS verified against
// the system's CAs or the issuer's CA file, never plain HTTP. The key set
// is written to the cache directory (the gateway's state dir), read back
// at the next start, and refetched every refresh interval; a token whose
// "kid" the set does not hold makes the verifier refetch at once, at most
// once per minimum refetch interval, which is how a key rotation is
// followed without letting a stream of forged kids hammer the issuer.
// While the issuer cannot be reached the last key set stays in use (up to
// MaxStale old), so a short outage of the issuer stops no job.
//
// A token is accepted only if it is a compact JWS signed with an
// asymmetric algorithm (RS*, PS*, ES*, EdDSA; never "none" or HMAC, so
// that an issuer's public key can never serve as an HMAC secret) by a key
// of its issuer's set whose type fits the algorithm; its "iss" is a
// configured issuer; its "aud" names one of the accepted audiences (the
// issuer's own list, else the gateway's advertised names; the WLCG
// "any" audience only where configured); it has "exp" and "sub", is not
// expired and not yet-to-be-valid (with a small leeway for clocks); and it
// carries every required scope and, if the issuer lists groups, one of
// them. What it gives is an [Identity]: issuer, subject and groups, which
// the gateway records as verified by the issuer.
package bearer

import "errors"

// ErrRefused wraps every reason a token is not accepted; the message says
// which check failed and what to do.
var ErrRefused = errors.New("bearer token refused")

// ErrUnavailable means the issuer's keys are not known (never fetched and
// the issuer unreachable, or the cache too old): the token may be good,
// the gateway cannot tell yet.
var ErrUnavailable = errors.New("issuer keys unavailable")

// MaxTokenSize bounds a token's text; WLCG tokens are 1 to 2 KiB.
const MaxTokenSize = 16 << 10
