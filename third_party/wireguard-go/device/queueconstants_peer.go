/* SPDX-License-Identifier: MIT
 *
 * Copyright (C) 2017-2025 WireGuard LLC. All Rights Reserved.
 */

package device

// QueuePeerSize is the depth of each peer's two sequential queues (batches
// of packets, in order, to send and to write to the TUN). Airlock's patch:
// upstream uses QueueOutboundSize and QueueInboundSize (1024 each), 16 KiB
// of channel buffers for every peer, where a gateway holds thousands of
// peers; 64 batches of up to IdealBatchSize packets each still hold far
// more than any one peer has in flight (third_party/wireguard-go/README.md).
const QueuePeerSize = 64
