// SPDX-License-Identifier: MIT

package gateway

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/airlock-vpn/airlock/internal/statefile"
	"github.com/airlock-vpn/airlock/internal/wgkey"
)

// loadOrCreateKey reads the gateway's WireGuard private key from path, or
// makes one (mode 0600) if the file does not exist.
func loadOrCreateKey(path string) (wgkey.Key, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := wgkey.Parse(strings.TrimSpace(string(b)))
		if err != nil {
			return wgkey.Key{}, fmt.Errorf("wireguard key %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return wgkey.Key{}, fmt.Errorf("read wireguard key: %w", err)
	}
	k, err := wgkey.Generate()
	if err != nil {
		return wgkey.Key{}, err
	}
	if err := statefile.WriteAtomic(path, []byte(k.String()+"\n"), 0o600); err != nil {
		return wgkey.Key{}, fmt.Errorf("write wireguard key: %w", err)
	}
	return k, nil
}

// writeJoinEnv writes the two values a job submission needs (the token is
// made separately) as shell-sourceable KEY=VALUE lines.
func writeJoinEnv(path string, info Info) error {
	s := fmt.Sprintf("# Airlock gateway: hand these to job submissions, with a token from 'airlock token create'.\nAIRLOCK_GATEWAY=%s\nAIRLOCK_PIN=%s\n",
		info.Advertise, info.Pins())
	return statefile.WriteAtomic(path, []byte(s), 0o644)
}

// deriveAdvertise picks the address clients dial when --advertise is not
// given: the listen host if it is specific, else the host's first global
// unicast IPv4 address, else its hostname.
func deriveAdvertise(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	if host != "" && net.ParseIP(host) == nil {
		return net.JoinHostPort(host, strconv.Itoa(port))
	}
	if ifaces, err := net.InterfaceAddrs(); err == nil {
		for _, ia := range ifaces {
			p, err := netip.ParsePrefix(ia.String())
			if err != nil {
				continue
			}
			if a := p.Addr(); a.Is4() && a.IsGlobalUnicast() {
				return net.JoinHostPort(a.String(), strconv.Itoa(port))
			}
		}
	}
	name, err := os.Hostname()
	if err != nil || name == "" {
		name = "localhost"
	}
	return net.JoinHostPort(name, strconv.Itoa(port))
}

// certHosts lists the names and addresses to put into the self-signed
// certificate. Clients verify the pin, not the names; the names help admins
// who inspect the certificate.
func certHosts(listenHost, advertise string) []string {
	var hosts []string
	if listenHost != "" {
		if a, err := netip.ParseAddr(listenHost); err != nil || !a.IsUnspecified() {
			hosts = append(hosts, listenHost)
		}
	}
	if h, _, err := net.SplitHostPort(advertise); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		hosts = append(hosts, name)
	}
	return hosts
}
