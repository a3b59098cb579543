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

}  // namespace wb
