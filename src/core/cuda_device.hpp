// The library's own CUDA helpers (private; weightbridge/device.hpp is what users see): the one device
// guard, the classification of errors that lose the context, and what the runtime knows of a pointer.
// Declared without CUDA types, defined in core/device.cpp; in builds without CUDA every device is
// unavailable (kUnsupported) and no pointer is device memory.
#pragma once

#include <cstddef>
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

/// cudaStreamLegacy, the legacy default stream (null without CUDA): what an update orders itself after when
/// the caller names no stream.
void* cuda_legacy_stream();

/// Copies between host memory and the memory of one device, on a stream of its own: set-up (the probe of
/// CUDA parameters) and staging (a version copied to or from pinned host staging). Calls enqueue; wait()
/// returns when all of them are done. Set-up constructs it (throws kCuda, kUnsupported without CUDA); the
/// update path gets a Status from each call.
class DeviceCopyStream {
 public:
  DeviceCopyStream() = default;
  explicit DeviceCopyStream(int device);
  ~DeviceCopyStream();
  DeviceCopyStream(DeviceCopyStream&& other) noexcept;
  DeviceCopyStream& operator=(DeviceCopyStream&& other) noexcept;
  DeviceCopyStream(const DeviceCopyStream&) = delete;
  DeviceCopyStream& operator=(const DeviceCopyStream&) = delete;

  bool valid() const { return stream_ != nullptr; }
  int device() const { return device_; }
  /// Later copies start after the work enqueued on `stream` (a cudaStream_t of this device) so far; null:
  /// the legacy default stream (and with it every blocking stream).
  Status after(void* stream) noexcept;
  /// cudaMemcpyAsync (any direction: host <-> device, device <-> device).
  Status copy(void* dst, const void* src, std::size_t bytes) noexcept;
  /// cudaMemsetAsync to zero.
  Status zero(void* dst, std::size_t bytes) noexcept;
  /// Waits for everything enqueued.
  Status wait() noexcept;

 private:
  void reset() noexcept;
  void* stream_ = nullptr;  // cudaStream_t
  void* event_ = nullptr;   // cudaEvent_t, for after()
  int device_ = 0;
};

/// Host memory pinned (cudaHostRegister) for this object's life, so that device copies from and into it
/// run at DMA rate and asynchronously. The range is widened to whole pages. Throws kCuda naming the range;
/// kUnsupported without CUDA.
class HostPinning {
 public:
  HostPinning() = default;
  HostPinning(void* address, std::size_t bytes);
  ~HostPinning();
  HostPinning(HostPinning&& other) noexcept;
  HostPinning& operator=(HostPinning&& other) noexcept;
  HostPinning(const HostPinning&) = delete;
  HostPinning& operator=(const HostPinning&) = delete;

 private:
  void reset() noexcept;
  void* address_ = nullptr;
};

}  // namespace wb
