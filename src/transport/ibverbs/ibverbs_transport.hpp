// The ibverbs transport: one-sided RDMA writes between machines over RC queue pairs (docs/architecture.md,
// "Transports"). Only the factory is public to the rest of the library; libibverbs is loaded with dlopen
// when it is first called, so a host without rdma-core runs every other transport. The implementation
// is split by lifecycle phase, and what needs no device by what it holds:
//
//   ibverbs_library.cpp     dlopen of libibverbs, its functions, ibv_fork_init
//   ibverbs_device.cpp      device discovery, NIC choice, completion and shared receive queues, teardown
//   ibverbs_memory.cpp      register_memory (host: ibv_reg_mr; CUDA: dma-buf or nvidia-peermem), import_memory
//   ibverbs_connect.cpp     endpoint record, queue pairs, INIT -> RTR -> RTS
//   ibverbs_data.cpp        post_writes, poll, draining a failed peer
//   ibverbs_events.cpp      asynchronous events -> failed peers, NICs, devices
//
//   ibverbs_config.*        the WB_IB_* settings                                    (device-free, unit-tested)
//   ibverbs_wire.*          endpoint records and memory keys                         (device-free, unit-tested)
//   ibverbs_addressing.*    GID and P_Key choice, GRH and DLID of a route             (device-free, unit-tested)
//   ibverbs_rails.*         striping, send queue, completion credits, batches, arrivals, receive budget
//   ibverbs_errors.*        failed completions and asynchronous events in words
//   ibverbs_topology.*      NICs near a GPU in the PCI tree
//   ibverbs_gpu_policy.*    dma-buf or nvidia-peermem, GPU flush before arrivals
//   ibverbs_cuda.*          the CUDA driver facts those need
#pragma once

#include <memory>
#include <string>

#include "transport/transport.hpp"

namespace wb {

/// An ibverbs transport for world rank `rank` over the NICs WB_IB_DEVICES and WB_IB_NIC_LOCALITY choose
/// (default: every active port, or those nearest the current GPU). Throws wb::Error(kUnsupported, "no RDMA
/// device: ...") when libibverbs cannot be loaded, ibv_get_device_list fails or finds no device, or no
/// port is usable (each unusable device or port is logged as a warning and skipped), so the caller can
/// choose another transport; kInvalidArgument for a bad WB_IB_* setting; kIbverbs when a device is there
/// but a verbs call fails. Not thread-safe: one thread sets it up, posts and polls.
std::unique_ptr<Transport> make_ibverbs_transport(int rank);

/// Whether this machine has an RDMA device (ibv_get_device_list finds one); `why` says why not. Cheap:
/// opens nothing. The choice of the transport between machines asks it once per process.
bool rdma_device_present(std::string& why);

}  // namespace wb
