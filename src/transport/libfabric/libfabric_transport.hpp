// The libfabric transport: one-sided writes between machines where ibverbs is not the fabric's interface
// (AWS EFA, HPE Slingshot `cxi`) or there is no RDMA at all (`tcp;ofi_rxm`). Only the factory is public to
// the rest of the library; the implementation is split by lifecycle phase in this folder:
//
//   fabric_setup.cpp     settings, provider choice, fabric / domain / completion queue / address vector /
//                        endpoint, capabilities, teardown
//   fabric_memory.cpp    register_memory (the provider's memory-registration mode), import_memory
//   fabric_connect.cpp   endpoint record, address-vector insertion
//   fabric_data.cpp      post_writes (a chain of writes ending in one write with remote CQ data), poll
//   fabric_records.cpp   what needs no fabric (records, provider ranking, batch completion): unit-tested
#pragma once

#include <memory>

#include "transport/transport.hpp"

namespace wb {

/// A libfabric transport for world rank `rank` over the provider WB_FI_PROVIDER names (default: the best
/// the machine offers). Throws wb::Error(kUnsupported) when the build has no libfabric or no provider
/// offers reliable-datagram endpoints with RMA here, so the caller can report why; kLibfabric when a
/// provider is there but a call fails. Not thread-safe: one thread sets it up, posts and polls.
std::unique_ptr<Transport> make_libfabric_transport(int rank);

/// The costly part of make_libfabric_transport, for no rank yet (transport/spare_transports.hpp opens it
/// ahead of need): the provider query, fabric, domain, queues and an enabled endpoint. tcp;ofi_rxm's
/// fi_enable zeroes its bounce-buffer pools: 190-220 ms and 71 MB at libfabric's 16 KiB buffers, 24-37 ms
/// and 9 MB at the 1 KiB that fi_rxm_buffer_bytes sets; a process's first provider query takes 75-95 ms
/// more. Throws as make_libfabric_transport.
std::unique_ptr<Transport> open_libfabric_spare();
/// Sets the provider parameters this transport chooses (the environment libfabric reads when it
/// initializes), once a process: open_libfabric_spare's caller calls it before starting the thread that
/// opens, so that the environment changes on its thread only.
void prepare_libfabric_environment();
/// A spare of open_libfabric_spare, now the transport of world rank `rank`. Throws kInvalidArgument when
/// `spare` is no unused libfabric spare.
std::unique_ptr<Transport> adopt_libfabric_spare(std::unique_ptr<Transport> spare, int rank);

}  // namespace wb
