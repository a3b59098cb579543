#include "comm/max_reduce.hpp"

#include <climits>
#include <cstring>

#include "core/checks.hpp"

namespace wb::comm {

Status reduce_max(std::span<std::uint32_t> values, MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  if (values.size() > static_cast<std::size_t>(INT_MAX))
    return Status(ErrorCode::kUnsupported, what + ": " + std::to_string(values.size()) + " words exceed an MPI count");
  const std::size_t bytes = values.size_bytes();
  OperationPtr op = make_operation(bytes, bytes);
  if (bytes > 0) std::memcpy(op->out.data(), values.data(), bytes);
  const int rc = MPI_Iallreduce(op->out.data(), op->in.data(), static_cast<int>(values.size()), MPI_UINT32_T, MPI_MAX,
                                comm, &op->request);
  if (rc != MPI_SUCCESS)
    return make_call_error(ErrorCode::kMpi, "MPI_Iallreduce", what + ": " + detail::mpi_error_string(rc), __FILE__, __LINE__);
  WB_RETURN_IF_ERROR(wait_for(op, waiter, true, what));
  if (bytes > 0) std::memcpy(values.data(), op->in.data(), bytes);
  return Status::ok();
}

}  // namespace wb::comm
