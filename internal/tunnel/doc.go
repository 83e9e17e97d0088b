// SPDX-License-Identifier: MIT

// Package tunnel sets up the WireGuard data channel (wireguard-go) on both
// ends: the gateway's device with one peer per lease, and the client's device
// with the gateway as its only peer. Keys are internal/wgkey's, given to
// wireguard-go's UAPI in hex.
package tunnel
