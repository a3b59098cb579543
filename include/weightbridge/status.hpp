// The error convention of WeightBridge.
//
// One rule: set-up code (settings, checkpoint I/O, probing, planning, connect) throws wb::Error; the
// update path (pack, post, poll, assemble) returns wb::Status and never throws, so a failed write can be
// retried or reported without unwinding through the transport. wb::Error carries a Status, so either
// form converts to the other without losing the code or the message.
//
// Every message names the rank, the failing call or object, and the cause; the check macros in
// checks.hpp add file:line.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace wb {

enum class ErrorCode : int {
  kOk = 0,
  kInvalidArgument,  // bad spec, bad setting, mismatched shapes
  kNotFound,         // unknown tensor or parameter name, missing file
  kCorruptData,      // truncated or malformed checkpoint, failed verification
  kUnsupported,      // feature or dtype not available in this build or on this machine
  kTimeout,          // a wait ran past its deadline
  kRetryLater,       // back-pressure: not an error for the caller, try again
  kMpi,              // an MPI call failed
  kHdf5,             // an HDF5 call failed
  kCuda,             // a CUDA runtime call failed
  kIbverbs,          // an ibverbs call failed
  kLibfabric,        // a libfabric call failed
  kSystem,           // an operating-system call failed (errno)
  kInternal,         // a broken invariant inside WeightBridge
};

std::string_view error_code_name(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return {}; }

  bool is_ok() const { return code_ == ErrorCode::kOk; }
  explicit operator bool() const { return is_ok(); }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  /// "[rank 3] corrupt data: ..." style text for logs.
  std::string to_string() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

/// Thrown by set-up code. what() is the full message including the rank prefix.
class Error : public std::runtime_error {
 public:
  explicit Error(Status status);
  Error(ErrorCode code, const std::string& message) : Error(Status(code, message)) {}

  const Status& status() const { return status_; }
  ErrorCode code() const { return status_.code(); }

 private:
  Status status_;
};

/// Builds a Status whose message is "<call> failed: <detail> (<file>:<line>, rank <r>)".
Status make_call_error(ErrorCode code, std::string_view call, std::string_view detail, const char* file,
                       int line);

/// Throws when the status is not ok (the bridge from the update path back to set-up code).
inline void throw_if_error(const Status& status) {
  if (!status.is_ok()) throw Error(status);
}

}  // namespace wb
