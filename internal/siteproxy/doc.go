// SPDX-License-Identifier: MIT

// Package siteproxy reaches a gateway outside the site through the site's
// web proxy: an HTTP CONNECT tunnel to the gateway's control port, named
// by HTTPS_PROXY/https_proxy and NO_PROXY/no_proxy as every HTTP client
// reads them (golang.org/x/net/http/httpproxy), with the proxy's
// credentials from the proxy URL's userinfo, from the file
// AIRLOCK_PROXY_AUTH_FILE names (one line USER:PASSWORD) or from a netrc
// entry for the proxy host ($NETRC, else ~/.netrc).
//
// Theory of operation: a [Dialer] first dials the gateway directly; when
// that fails (or does not connect within DirectTimeout) and the
// environment names a proxy for the gateway, it dials through the proxy
// and remembers, per gateway address, that the proxy is the way: later
// dials (renewals, the TCP transport, reconnects) go through the proxy
// first and try direct again only if the proxy fails. The TLS session to
// the gateway runs end to end inside the CONNECT tunnel, so the gateway's
// pin is checked exactly as on a direct connection; the proxy sees only
// the gateway's address and ciphertext. The WireGuard UDP transport never
// uses the proxy (HTTP proxies carry TCP); a job behind a proxy-only site
// runs on the TCP/TLS transport.
//
// A proxy's refusal is a definite answer with its fix: 403 means the
// proxy's rules do not allow CONNECT to the gateway's port (squid, by
// default, allows CONNECT only to port 443), 407 that it wants (other)
// credentials.
package siteproxy
