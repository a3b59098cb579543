// The element-wise maximum of a vector of unsigned 32-bit words over the ranks of a communicator, in one
// MPI_Iallreduce, waited for as every wait of the control plane is (comm/operation.hpp). The trainers'
// amax exchange of FP8 blocks split between them (exec/quantized_pack.hpp): the bit patterns of |amax|
// order as the values do, NaN above infinity, so the maximum of the patterns is the pattern of the maximum.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <span>
#include <string>

#include "comm/operation.hpp"

namespace wb::comm {

/// Replaces `values` on every rank of `comm` with the element-wise maximum over the ranks (every rank
/// passes as many). Update path: a Status, never a throw; kTimeout at the waiter's deadline.
Status reduce_max(std::span<std::uint32_t> values, MPI_Comm comm, const Waiter& waiter, const std::string& what);

}  // namespace wb::comm
