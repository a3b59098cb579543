#include "weightbridge/status.hpp"

#include <mpi.h>

#include <string>

#include "core/checks.hpp"
#include "core/log.hpp"

namespace wb {
namespace {

std::string rank_prefix() {
  const int rank = process_rank();
  return rank >= 0 ? "[rank " + std::to_string(rank) + "] " : std::string();
}

}  // namespace

std::string_view error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kCorruptData: return "corrupt data";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kTimeout: return "timeout";
    case ErrorCode::kRetryLater: return "retry later";
    case ErrorCode::kMpi: return "MPI error";
    case ErrorCode::kHdf5: return "HDF5 error";
    case ErrorCode::kCuda: return "CUDA error";
    case ErrorCode::kIbverbs: return "ibverbs error";
    case ErrorCode::kLibfabric: return "libfabric error";
    case ErrorCode::kSystem: return "system error";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown error";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return rank_prefix() + std::string(error_code_name(code_)) + ": " + message_;
}

Error::Error(Status status) : std::runtime_error(status.to_string()), status_(std::move(status)) {}

Status make_call_error(ErrorCode code, std::string_view call, std::string_view detail, const char* file,
                       int line) {
  std::string message(call);
  message += " failed: ";
  message += detail;
  message += " (";
  message += file;
  message += ":";
  message += std::to_string(line);
  message += ")";
  return Status(code, std::move(message));
}

namespace detail {

std::string mpi_error_string(int code) {
  // Open MPI aborts MPI_Error_string outside MPI_Init..MPI_Finalize; say what we can instead.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return "MPI error code " + std::to_string(code) + " (MPI not initialized)";
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error code " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

}  // namespace detail
}  // namespace wb
