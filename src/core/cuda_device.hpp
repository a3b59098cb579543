// The library's own CUDA helpers (private; weightbridge/device.hpp is what users see): the one device
// guard, the classification of errors that lose the context, and what the runtime knows of a pointer.
// Declared without CUDA types, defined in core/device.cpp; in builds without CUDA every device is
// unavailable (kUnsupported) and no pointer is device memory.
#pragma once

#include <cstdint>
#include <string>

#include "weightbridge/status.hpp"

namespace wb {

/// Makes a device current for one scope and makes the caller's current again at its end. Set-up code
/// constructs it with the device (throws wb::Error kCuda naming the call); the update path and teardown
/// construct it empty and enter(), which returns a Status.
class DeviceGuard {
 public:
  DeviceGuard() = default;
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

  /// Makes `device` current (once per guard).
  Status enter(int device) noexcept;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// True for the errors after which the CUDA context is unusable ("sticky": a kernel faulted, e.g.
/// cudaErrorIllegalAddress, cudaErrorLaunchFailure, cudaErrorMisalignedAddress): every later call of the
/// process returns them again, and only a new process recovers.
bool cuda_error_is_sticky(int code);

/// What the runtime knows of an address.
struct CudaPointerInfo {
  enum class Kind : std::uint8_t { kUnregistered, kHost, kDevice, kManaged };
  Kind kind = Kind::kUnregistered;
  int device = -1;                      // kDevice, kManaged: the device it belongs to
  std::uint64_t allocation_base = 0;    // kDevice: the cudaMalloc (or cuMemAlloc) allocation around it
  std::uint64_t allocation_bytes = 0;
};
/// "unregistered host memory", "pinned host memory", "device memory", "managed memory".
const char* cuda_pointer_kind_name(CudaPointerInfo::Kind kind);

/// cudaPointerGetAttributes and, for device memory, cuMemGetAddressRange (reached through the runtime,
/// so the library does not link libcuda). Set-up code: throws wb::Error (kCuda) when the runtime fails,
/// kUnsupported without CUDA.
CudaPointerInfo query_cuda_pointer(const void* address);

}  // namespace wb
