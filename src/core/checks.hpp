// Check macros for the external APIs WeightBridge calls. Each reports the call as written, the
// library's own error string, file:line and the MPI rank. The WB_CHECK_* forms throw wb::Error (set-up
// code); the WB_TRY_* forms return a wb::Status from the enclosing function (update path).
//
// The macros only expand to library calls where they are used, so this header needs neither CUDA nor
// ibverbs nor libfabric headers: include those before using WB_CHECK_CUDA, WB_CHECK_IBV or WB_CHECK_FI.
#pragma once

#include <cerrno>
#include <cstring>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::detail {
/// MPI_Error_string of an MPI return code.
std::string mpi_error_string(int code);
/// The message of the innermost entry of HDF5's error stack (or a generic text when it is empty).
std::string hdf5_error_string();
/// "cudaErrorX: its description" for a cudaError_t: the one CUDA error text of every check and message.
std::string cuda_error_string(int code);
}  // namespace wb::detail

#define WB_STATUS_FROM_CALL_(code, call, detail) ::wb::make_call_error(code, call, detail, __FILE__, __LINE__)

/// MPI calls return MPI_SUCCESS; anything else becomes an error with MPI_Error_string.
#define WB_CHECK_MPI(call)                                                                                 \
  do {                                                                                                     \
    const int wb_rc_ = (call);                                                                             \
    if (wb_rc_ != 0 /* MPI_SUCCESS */)                                                                     \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kMpi, #call, ::wb::detail::mpi_error_string(wb_rc_))); \
  } while (0)

#define WB_TRY_MPI(call)                                                                                   \
  do {                                                                                                     \
    const int wb_rc_ = (call);                                                                             \
    if (wb_rc_ != 0) return WB_STATUS_FROM_CALL_(::wb::ErrorCode::kMpi, #call, ::wb::detail::mpi_error_string(wb_rc_)); \
  } while (0)

/// HDF5 calls signal failure with a negative herr_t/hid_t.
#define WB_CHECK_HDF5(call)                                                                                \
  ([&]() {                                                                                                 \
    auto wb_rc_ = (call);                                                                                  \
    if (wb_rc_ < 0)                                                                                        \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kHdf5, #call, ::wb::detail::hdf5_error_string())); \
    return wb_rc_;                                                                                         \
  }())

/// CUDA runtime calls return cudaSuccess (0); requires <cuda_runtime_api.h>.
#define WB_CHECK_CUDA(call)                                                                                \
  do {                                                                                                     \
    const cudaError_t wb_rc_ = (call);                                                                     \
    if (wb_rc_ != cudaSuccess)                                                                             \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kCuda, #call,                              \
                                             ::wb::detail::cuda_error_string(static_cast<int>(wb_rc_))));  \
  } while (0)

#define WB_TRY_CUDA(call)                                                                                  \
  do {                                                                                                     \
    const cudaError_t wb_rc_ = (call);                                                                     \
    if (wb_rc_ != cudaSuccess)                                                                             \
      return WB_STATUS_FROM_CALL_(::wb::ErrorCode::kCuda, #call,                                         \
                                  ::wb::detail::cuda_error_string(static_cast<int>(wb_rc_)));             \
  } while (0)

/// ibverbs calls that return an int give 0 on success and an errno value (or -1 with errno) otherwise.
#define WB_CHECK_IBV(call)                                                                                 \
  do {                                                                                                     \
    const int wb_rc_ = (call);                                                                             \
    if (wb_rc_ != 0) {                                                                                     \
      const int wb_errno_ = wb_rc_ > 0 ? wb_rc_ : errno;                                                   \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kIbverbs, #call, std::strerror(wb_errno_))); \
    }                                                                                                      \
  } while (0)

/// ibverbs calls that return a pointer give NULL with errno set on failure.
#define WB_CHECK_IBV_PTR(call)                                                                             \
  ([&]() {                                                                                                 \
    auto* wb_ptr_ = (call);                                                                                \
    if (wb_ptr_ == nullptr)                                                                                \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kIbverbs, #call, std::strerror(errno)));    \
    return wb_ptr_;                                                                                        \
  }())

/// libfabric calls return 0 (or a non-negative count) on success and a negative fabric errno otherwise;
/// requires <rdma/fabric.h> (fi_strerror).
#define WB_CHECK_FI(call)                                                                                  \
  ([&]() {                                                                                                 \
    const auto wb_rc_ = (call);                                                                            \
    if (wb_rc_ < 0)                                                                                        \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kLibfabric, #call,                         \
                                             std::string(fi_strerror(static_cast<int>(-wb_rc_))) + " (" + \
                                                 std::to_string(wb_rc_) + ")"));                           \
    return wb_rc_;                                                                                         \
  }())

/// Operating-system calls returning -1 with errno.
#define WB_CHECK_SYS(call)                                                                                 \
  ([&]() {                                                                                                 \
    auto wb_rc_ = (call);                                                                                  \
    if (wb_rc_ == -1)                                                                                      \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kSystem, #call, std::strerror(errno)));     \
    return wb_rc_;                                                                                         \
  }())

/// Propagates a non-ok Status from the enclosing function.
#define WB_RETURN_IF_ERROR(expr)                      \
  do {                                                \
    ::wb::Status wb_status_ = (expr);                 \
    if (!wb_status_.is_ok()) return wb_status_;       \
  } while (0)

/// Internal invariant: throws kInternal with the condition text and file:line.
#define WB_ASSERT(cond, message)                                                                           \
  do {                                                                                                     \
    if (!(cond))                                                                                           \
      throw ::wb::Error(WB_STATUS_FROM_CALL_(::wb::ErrorCode::kInternal, "assertion `" #cond "`", message)); \
  } while (0)
