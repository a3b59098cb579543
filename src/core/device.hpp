// CUDA devices: whether this process can use one, why not, and a little device memory for set-up
// code, tests and benchmarks. Compiles and links with or without CUDA; without it every device
// count is 0 and allocations throw kUnsupported.
#pragma once

#include <cstddef>
#include <string>

namespace wb {

/// Number of CUDA devices this process can use: 0 when the library was built without CUDA or the
/// runtime reports an error (no driver, no device, CUDA_VISIBLE_DEVICES empty...). Queried once.
int cuda_device_count();

/// Why cuda_device_count() is 0, for skip messages and logs: "built without CUDA", or the failing
/// call with the CUDA error name and text, e.g. "cudaGetDeviceCount: cudaErrorNoDevice: no
/// CUDA-capable device is detected". Empty when a device is available.
const std::string& cuda_unavailable_reason();

/// Device memory owned by this object: cudaMalloc on `device` at construction, cudaFree at
/// destruction. Set-up code, tests and benchmarks only: the update path allocates nothing.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Throws kUnsupported without CUDA and kCuda when the allocation fails. Zero bytes allocate nothing.
  DeviceBuffer(std::size_t bytes, int device = 0);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  std::size_t size() const { return size_; }
  int device() const { return device_; }

 private:
  void reset() noexcept;

  void* data_ = nullptr;
  std::size_t size_ = 0;
  int device_ = 0;
};

/// Copies `bytes` between any two of host and device memory (cudaMemcpyDefault) and returns when the
/// copy is complete. Throws kUnsupported without CUDA and kCuda when the runtime fails.
void cuda_copy(void* dst, const void* src, std::size_t bytes);

/// Waits for all work on the current device (cudaDeviceSynchronize). Throws like cuda_copy.
void cuda_synchronize();

}  // namespace wb
