// SPDX-License-Identifier: MIT

package netstack

// dnsPort is the port of the DNS server on the tunnel address.
const dnsPort = 53
