// CUDA parameters are checked at construction: every parameter device memory of the stated device, inside
// one allocation. A misconfiguration (a host pointer, another device, a size past the allocation) is then
// an error at connect naming the parameter, not an illegal address in a kernel at the first update.
#pragma once

#include <functional>

#include "core/cuda_device.hpp"
#include "exec/round_executor.hpp"

namespace wb::exec {

/// What the runtime knows of an address (query_cuda_pointer; tests pass their own).
using PointerQuery = std::function<CudaPointerInfo(const void*)>;

/// Throws wb::Error (kInvalidArgument) naming rank `rank`, the parameter's index, size and address, and
/// what the memory is instead. Parameters of 0 bytes are not checked.
void check_device_parameters(int rank, const ParameterMemory& parameters, const PointerQuery& query = query_cuda_pointer);

}  // namespace wb::exec
