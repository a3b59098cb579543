#include "weightbridge/device.hpp"

#include <string>
#include <utility>

#include "weightbridge/checks.hpp"
#include "weightbridge/status.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace wb {
namespace {

struct DeviceQuery {
  int count = 0;
  std::string reason;
};

DeviceQuery query_devices() {
  DeviceQuery query;
#ifdef WB_HAVE_CUDA
  int count = 0;
  const cudaError_t rc = cudaGetDeviceCount(&count);
  if (rc != cudaSuccess) {
    // The error is not sticky, but clear it so a later cudaGetLastError does not report it again.
    (void)cudaGetLastError();
    query.reason = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc);
  } else if (count <= 0) {
    query.reason = "cudaGetDeviceCount: cudaSuccess, but no device is visible to this process";
  } else {
    query.count = count;
  }
#else
  query.reason = "built without CUDA";
#endif
  return query;
}

const DeviceQuery& device_query() {
  static const DeviceQuery query = query_devices();
  return query;
}

#ifndef WB_HAVE_CUDA
[[noreturn]] void throw_no_cuda(const char* call) {
  throw Error(ErrorCode::kUnsupported, std::string(call) + ": built without CUDA");
}
#endif

}  // namespace

int cuda_device_count() { return device_query().count; }

const std::string& cuda_unavailable_reason() { return device_query().reason; }

#ifdef WB_HAVE_CUDA

namespace {
// Makes `device` current for the lifetime of the guard (set-up code: throws).
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    WB_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) WB_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};
}  // namespace

DeviceBuffer::DeviceBuffer(std::size_t bytes, int device) : size_(bytes), device_(device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  WB_CHECK_CUDA(cudaMalloc(&data_, bytes));
}

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) {
    int previous = 0;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    (void)cudaFree(data_);
    if (switched) (void)cudaSetDevice(previous);
  }
  data_ = nullptr;
  size_ = 0;
}

void cuda_copy(void* dst, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  WB_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, nullptr));
  WB_CHECK_CUDA(cudaStreamSynchronize(nullptr));
}

void cuda_synchronize() { WB_CHECK_CUDA(cudaDeviceSynchronize()); }

#else

DeviceBuffer::DeviceBuffer(std::size_t bytes, int device) : size_(0), device_(device) {
  if (bytes != 0) throw_no_cuda("DeviceBuffer");
}

void DeviceBuffer::reset() noexcept {
  data_ = nullptr;
  size_ = 0;
}

void cuda_copy(void*, const void*, std::size_t bytes) {
  if (bytes != 0) throw_no_cuda("cuda_copy");
}

void cuda_synchronize() { throw_no_cuda("cuda_synchronize"); }

#endif

DeviceBuffer::~DeviceBuffer() { reset(); }

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

}  // namespace wb
