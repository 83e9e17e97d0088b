package main

import (
	_ "github.com/miekg/dns"
	_ "github.com/peterbourgon/ff/v3/ffcli"
	_ "github.com/vishvananda/netlink"
	_ "go.etcd.io/bbolt"
	_ "golang.org/x/sys/unix"
	_ "golang.org/x/time/rate"
	_ "golang.zx2c4.com/wireguard/device"
	_ "gvisor.dev/gvisor/pkg/tcpip/stack"
	_ "gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	_ "gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
)

func main() {}
