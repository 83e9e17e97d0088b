/* SPDX-License-Identifier: MIT
 *
 * Copyright (C) 2017-2025 WireGuard LLC. All Rights Reserved.
 */

// Package conn implements WireGuard's network connections.
package conn

import (
	upstream "golang.zx2c4.com/wireguard/conn"
)

const (
	IdealBatchSize = upstream.IdealBatchSize // maximum number of packets handled per read and write
)

// Airlock: the fork's types are upstream's (golang.zx2c4.com/wireguard/conn),
// so that its StdNetBind is a conn.Bind that the device and every other user
// of upstream's package take as it is.
type (
	ReceiveFunc           = upstream.ReceiveFunc
	Bind                  = upstream.Bind
	BindSocketToInterface = upstream.BindSocketToInterface
	PeekLookAtSocketFd    = upstream.PeekLookAtSocketFd
	Endpoint              = upstream.Endpoint
)

var (
	ErrBindAlreadyOpen   = upstream.ErrBindAlreadyOpen
	ErrWrongEndpointType = upstream.ErrWrongEndpointType
)
