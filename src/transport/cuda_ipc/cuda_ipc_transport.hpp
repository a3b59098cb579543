// Private: the cuda_ipc transport (built only with CUDA). One-sided writes into CUDA memory of another
// process on the same machine: the receiver exports its allocation with cudaIpcGetMemHandle, the writer
// opens it with cudaIpcOpenMemHandle and copies a batch's writes with one batched copy
// (cuda_ipc/copy_batch.hpp) on a stream per peer. An event recorded after a batch tells poll when the copies
// are complete; only then does the writer put the batch's notification into the receiver's mailbox
// (shm/mailbox.hpp), so a kArrival always follows the bytes.
#pragma once

#include <memory>

#include "transport/transport.hpp"

namespace wb {

/// The cuda_ipc transport of world rank `rank`, on the CUDA device current at the call. Throws
/// kUnsupported with the runtime's reason when no CUDA device can be used here.
std::unique_ptr<Transport> make_cuda_ipc_transport(int rank);

}  // namespace wb
