#include "exec/parameter_check.hpp"

#include <cstdio>
#include <string>

#include "core/hex.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
void check_device_parameters(int rank, const ParameterMemory& parameters, const PointerQuery& query) {
  if (parameters.data.size() != parameters.bytes.size())
    throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(rank) + ": " + std::to_string(parameters.data.size()) +
                                                 " parameter addresses for " + std::to_string(parameters.bytes.size()) +
                                                 " sizes");
  const std::string device = "cuda:" + std::to_string(parameters.device);
  for (std::size_t p = 0; p < parameters.data.size(); ++p) {
    const std::size_t bytes = parameters.bytes[p];
    if (bytes == 0) continue;
    const auto address = reinterpret_cast<std::uint64_t>(parameters.data[p]);
    const std::string what = "rank " + std::to_string(rank) + ": parameter " + std::to_string(p) + " (" +
                             std::to_string(bytes) + " bytes at " + hex(address) + ")";
    if (address == 0) throw Error(ErrorCode::kInvalidArgument, what + " has no address");
    const CudaPointerInfo info = query(parameters.data[p]);
    if (info.kind != CudaPointerInfo::Kind::kDevice)
      throw Error(ErrorCode::kInvalidArgument, what + " is " + cuda_pointer_kind_name(info.kind) +
                                                   ", not device memory of " + device + " as ParameterMemory says");
    if (info.device != parameters.device)
      throw Error(ErrorCode::kInvalidArgument, what + " is device memory of cuda:" + std::to_string(info.device) +
                                                   ", not of " + device + " as ParameterMemory says");
    if (address < info.allocation_base || address - info.allocation_base > info.allocation_bytes ||
        bytes > info.allocation_bytes - (address - info.allocation_base))
      throw Error(ErrorCode::kInvalidArgument, what + " runs past the end of its allocation (" +
                                                   std::to_string(info.allocation_bytes) + " bytes at " +
                                                   hex(info.allocation_base) + ")");
  }
}

}  // namespace wb::exec
