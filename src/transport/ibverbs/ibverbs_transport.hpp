// The ibverbs transport: one-sided RDMA writes between machines over RC queue pairs (DESIGN.md,
// "Transports"). Only the factory is public to the rest of the library; the implementation is split by
// lifecycle phase in this folder:
//
//   ibverbs_device.cpp    settings, device discovery, NICs (PD, CQ, SRQ), capabilities, teardown
//   ibverbs_memory.cpp    register_memory (host: ibv_reg_mr; CUDA: dma-buf), import_memory
//   ibverbs_connect.cpp   endpoint record, queue pairs, INIT -> RTR -> RTS
//   ibverbs_data.cpp      post_writes, poll
//   ibverbs_logic.cpp     what needs no device (records, striping, accounting, messages): unit-tested
#pragma once

#include <memory>
#include <string>

#include "weightbridge/transport.hpp"

namespace wb {

/// An ibverbs transport for world rank `rank` over the NICs WB_IB_DEVICES names (default: every active
/// port). Throws wb::Error(kUnsupported, "no RDMA device: ...") when ibv_get_device_list fails or finds
/// no device or no active port, so the caller can choose another transport; kInvalidArgument for a bad
/// WB_IB_* setting; kIbverbs when a device is there but a verbs call fails. Not thread-safe: one thread
/// sets it up, posts and polls.
std::unique_ptr<Transport> make_ibverbs_transport(int rank);

/// Whether this machine has an RDMA device (ibv_get_device_list finds one); `why` says why not. Cheap:
/// opens nothing. The choice of the transport between machines asks it once per process.
bool rdma_device_present(std::string& why);

}  // namespace wb
