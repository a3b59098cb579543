// Private: the cma transport. One-sided writes into registered host memory of another process on the
// same machine with process_vm_writev (Linux cross-memory attach); notifications through the receiver's
// mailbox (mailbox.hpp), so neither the bytes nor the arrivals go through MPI.
#pragma once

#include <memory>

#include "transport/transport.hpp"

namespace wb {

/// The cma transport of world rank `rank`. Throws when the mailbox cannot be mapped.
std::unique_ptr<Transport> make_cma_transport(int rank);

}  // namespace wb
