// Transfer buffers of CUDA parameters (see transfer_memory.hpp): device memory, or the guarded host
// mapping registered with CUDA. Builds with CUDA only.
#include <cuda_runtime_api.h>

#include <memory>
#include <optional>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/log.hpp"
#include "exec/host_mapping.hpp"
#include "exec/transfer_memory.hpp"

namespace wb::exec {
namespace {

class DeviceMemory final : public BufferMemory {
 public:
  DeviceMemory(std::size_t bytes, int device) : device_(device) {
    DeviceGuard guard(device);
    void* memory = nullptr;
    WB_CHECK_CUDA(cudaMalloc(&memory, bytes));
    data_ = for_copies_ = static_cast<std::byte*>(memory);
    size_ = bytes;
    // Zeroed, and the zeroing complete, before any transport registers or exports the memory: cudaMemset
    // may return before it is done, and a peer's first write could then be overwritten.
    cudaStream_t stream = nullptr;
    cudaError_t rc = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess) rc = cudaMemsetAsync(memory, 0, bytes, stream);
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    if (rc != cudaSuccess) {
      (void)cudaFree(memory);
      throw Error(make_call_error(ErrorCode::kCuda, "zeroing transfer buffers (cudaMemsetAsync)",
                                  detail::cuda_error_string(rc), __FILE__, __LINE__));
    }
  }
  ~DeviceMemory() override {
    if (abandoned_) return;
    DeviceGuard guard;
    (void)guard.enter(device_);
    (void)cudaFree(data_);
  }
  void abandon() noexcept override {
    if (!abandoned_) {
      WB_LOG(kWarn) << "transfer buffer of " << size_ << " bytes on cuda:" << device_
                    << " left allocated: a peer may still have it open through CUDA IPC";
    }
    abandoned_ = true;
  }

 private:
  int device_;
  bool abandoned_ = false;
};

class PinnedMemory final : public BufferMemory {
 public:
  PinnedMemory(std::size_t bytes, int device) : mapping_(bytes), device_(device) {
    DeviceGuard guard(device);
    WB_CHECK_CUDA(cudaHostRegister(mapping_.data(), bytes, cudaHostRegisterMapped | cudaHostRegisterPortable));
    void* mapped = nullptr;
    if (const cudaError_t rc = cudaHostGetDevicePointer(&mapped, mapping_.data(), 0); rc != cudaSuccess) {
      (void)cudaHostUnregister(mapping_.data());
      throw Error(make_call_error(ErrorCode::kCuda, "cudaHostGetDevicePointer", detail::cuda_error_string(rc), __FILE__,
                                  __LINE__));
    }
    data_ = mapping_.data();
    for_copies_ = static_cast<std::byte*>(mapped);
    size_ = bytes;
  }
  // Unregistered, then the mapping's guard takes over (a late cma write fails with EFAULT).
  ~PinnedMemory() override {
    DeviceGuard guard;
    (void)guard.enter(device_);
    (void)cudaHostUnregister(mapping_.data());
  }

 private:
  HostMapping mapping_;
  int device_;
};

}  // namespace

std::unique_ptr<BufferMemory> allocate_pinned_buffer(std::size_t bytes, int device) {
  return std::make_unique<PinnedMemory>(bytes, device);
}

std::unique_ptr<BufferMemory> allocate_device_buffer(std::size_t bytes, int device) {
  return std::make_unique<DeviceMemory>(bytes, device);
}

}  // namespace wb::exec
