// CUDA devices: the public queries and buffers of weightbridge/device.hpp and the library's own helpers of
// core/cuda_device.hpp (guard, error text and classes, pointer queries), with and without CUDA.
#include "core/device.hpp"

#include <unistd.h>

#include <cstdint>
#include <string>
#include <utility>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "weightbridge/status.hpp"

#ifdef WB_HAVE_CUDA
#include <cuda.h>  // CUresult and CUdeviceptr only: the driver is reached through cudaGetDriverEntryPoint*
#include <cudaTypedefs.h>
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
    query.reason = "cudaGetDeviceCount: " + detail::cuda_error_string(rc);
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

/// The allocation that contains `address` (cuMemGetAddressRange, found through the runtime so that the
/// library does not link libcuda).
void allocation_range(const void* address, std::uint64_t& base, std::uint64_t& size) {
  static PFN_cuMemGetAddressRange_v3020 get_range = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    WB_CHECK_CUDA(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &function, 12000, cudaEnableDefault, &found));
#elif CUDART_VERSION >= 12000
    WB_CHECK_CUDA(cudaGetDriverEntryPoint("cuMemGetAddressRange", &function, cudaEnableDefault, &found));
#else
    WB_CHECK_CUDA(cudaGetDriverEntryPoint("cuMemGetAddressRange", &function, cudaEnableDefault));
    found = cudaDriverEntryPointSuccess;
#endif
    if (found != cudaDriverEntryPointSuccess || function == nullptr)
      throw Error(ErrorCode::kCuda, "the CUDA driver has no cuMemGetAddressRange (query result " +
                                        std::to_string(static_cast<int>(found)) + ")");
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(function);
  }();
  CUdeviceptr start = 0;
  std::size_t bytes = 0;
  if (const CUresult rc = get_range(&start, &bytes, reinterpret_cast<CUdeviceptr>(address)); rc != CUDA_SUCCESS)
    throw Error(ErrorCode::kCuda, "cuMemGetAddressRange(" + std::to_string(reinterpret_cast<std::uint64_t>(address)) +
                                      ") failed: CUresult " + std::to_string(static_cast<int>(rc)));
  base = static_cast<std::uint64_t>(start);
  size = bytes;
}

}  // namespace

namespace detail {
std::string cuda_error_string(int code) {
  const auto rc = static_cast<cudaError_t>(code);
  return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
}
}  // namespace detail

DeviceGuard::DeviceGuard(int device) { throw_if_error(enter(device)); }

Status DeviceGuard::enter(int device) noexcept {
  WB_TRY_CUDA(cudaGetDevice(&previous_));
  if (previous_ != device) {
    WB_TRY_CUDA(cudaSetDevice(device));
    switched_ = true;
  }
  return Status::ok();
}

DeviceGuard::~DeviceGuard() {
  if (switched_) (void)cudaSetDevice(previous_);
}

bool cuda_error_is_sticky(int code) {
  switch (static_cast<cudaError_t>(code)) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorLaunchFailure:
    case cudaErrorECCUncorrectable: return true;
    default: return false;
  }
}

CudaPointerInfo query_cuda_pointer(const void* address) {
  CudaPointerInfo info;
  cudaPointerAttributes attributes{};
  WB_CHECK_CUDA(cudaPointerGetAttributes(&attributes, address));
  switch (attributes.type) {
    case cudaMemoryTypeHost: info.kind = CudaPointerInfo::Kind::kHost; break;
    case cudaMemoryTypeDevice: info.kind = CudaPointerInfo::Kind::kDevice; break;
    case cudaMemoryTypeManaged: info.kind = CudaPointerInfo::Kind::kManaged; break;
    default: info.kind = CudaPointerInfo::Kind::kUnregistered; break;
  }
  info.device = attributes.device;
  if (info.kind == CudaPointerInfo::Kind::kDevice) allocation_range(address, info.allocation_base, info.allocation_bytes);
  return info;
}

DeviceBuffer::DeviceBuffer(std::size_t bytes, int device) : size_(bytes), device_(device) {
  if (bytes == 0) return;
  DeviceGuard guard(device);
  WB_CHECK_CUDA(cudaMalloc(&data_, bytes));
}

void DeviceBuffer::reset() noexcept {
  if (data_ != nullptr) {
    DeviceGuard guard;
    (void)guard.enter(device_);
    (void)cudaFree(data_);
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

void* cuda_legacy_stream() { return static_cast<void*>(cudaStreamLegacy); }

DeviceCopyStream::DeviceCopyStream(int device) : device_(device) {
  DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  WB_CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  stream_ = stream;
  cudaEvent_t event = nullptr;
  if (const cudaError_t rc = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); rc != cudaSuccess) {
    reset();
    WB_CHECK_CUDA(rc);
  }
  event_ = event;
}

void DeviceCopyStream::reset() noexcept {
  if (stream_ == nullptr && event_ == nullptr) return;
  DeviceGuard guard;
  (void)guard.enter(device_);
  if (stream_ != nullptr) (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_));
  if (stream_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  stream_ = event_ = nullptr;
}

Status DeviceCopyStream::after(void* stream) noexcept {
  DeviceGuard guard;
  if (Status s = guard.enter(device_); !s) return s;
  // The legacy default stream orders after all blocking streams; a non-blocking caller stream is named.
  WB_TRY_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)));
  WB_TRY_CUDA(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), static_cast<cudaEvent_t>(event_), 0));
  return Status::ok();
}

Status DeviceCopyStream::copy(void* dst, const void* src, std::size_t bytes) noexcept {
  if (bytes == 0) return Status::ok();
  DeviceGuard guard;
  if (Status s = guard.enter(device_); !s) return s;
  WB_TRY_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Status DeviceCopyStream::zero(void* dst, std::size_t bytes) noexcept {
  if (bytes == 0) return Status::ok();
  DeviceGuard guard;
  if (Status s = guard.enter(device_); !s) return s;
  WB_TRY_CUDA(cudaMemsetAsync(dst, 0, bytes, static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Status DeviceCopyStream::wait() noexcept {
  if (stream_ == nullptr) return Status::ok();
  WB_TRY_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

HostPinning::HostPinning(void* address, std::size_t bytes) {
  if (bytes == 0) return;
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const std::uintptr_t begin = reinterpret_cast<std::uintptr_t>(address) / page * page;
  const std::uintptr_t end = (reinterpret_cast<std::uintptr_t>(address) + bytes + page - 1) / page * page;
  void* base = reinterpret_cast<void*>(begin);
  if (const cudaError_t rc = cudaHostRegister(base, end - begin, cudaHostRegisterPortable); rc != cudaSuccess)
    throw Error(make_call_error(ErrorCode::kCuda, "cudaHostRegister of " + std::to_string(end - begin) + " bytes of staging",
                                detail::cuda_error_string(rc), __FILE__, __LINE__));
  address_ = base;
}

void HostPinning::reset() noexcept {
  if (address_ != nullptr) (void)cudaHostUnregister(address_);
  address_ = nullptr;
}

#else

namespace detail {
std::string cuda_error_string(int code) { return "CUDA error " + std::to_string(code) + " (built without CUDA)"; }
}  // namespace detail

DeviceGuard::DeviceGuard(int device) { throw_if_error(enter(device)); }
Status DeviceGuard::enter(int) noexcept { return Status(ErrorCode::kUnsupported, "CUDA device: built without CUDA"); }
DeviceGuard::~DeviceGuard() = default;

bool cuda_error_is_sticky(int) { return false; }

CudaPointerInfo query_cuda_pointer(const void*) { throw_no_cuda("query_cuda_pointer"); }

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

void* cuda_legacy_stream() { return nullptr; }

DeviceCopyStream::DeviceCopyStream(int device) : device_(device) { throw_no_cuda("DeviceCopyStream"); }
void DeviceCopyStream::reset() noexcept { stream_ = event_ = nullptr; }
Status DeviceCopyStream::after(void*) noexcept { return Status(ErrorCode::kUnsupported, "DeviceCopyStream: built without CUDA"); }
Status DeviceCopyStream::copy(void*, const void*, std::size_t) noexcept {
  return Status(ErrorCode::kUnsupported, "DeviceCopyStream: built without CUDA");
}
Status DeviceCopyStream::zero(void*, std::size_t) noexcept {
  return Status(ErrorCode::kUnsupported, "DeviceCopyStream: built without CUDA");
}
Status DeviceCopyStream::wait() noexcept { return Status::ok(); }

HostPinning::HostPinning(void*, std::size_t bytes) {
  if (bytes != 0) throw_no_cuda("cudaHostRegister");
}
void HostPinning::reset() noexcept { address_ = nullptr; }

#endif

const char* cuda_pointer_kind_name(CudaPointerInfo::Kind kind) {
  switch (kind) {
    case CudaPointerInfo::Kind::kHost: return "pinned host memory";
    case CudaPointerInfo::Kind::kDevice: return "device memory";
    case CudaPointerInfo::Kind::kManaged: return "managed memory";
    case CudaPointerInfo::Kind::kUnregistered: break;
  }
  return "unregistered host memory";
}

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

DeviceCopyStream::~DeviceCopyStream() { reset(); }
DeviceCopyStream::DeviceCopyStream(DeviceCopyStream&& other) noexcept
    : stream_(std::exchange(other.stream_, nullptr)), event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}
DeviceCopyStream& DeviceCopyStream::operator=(DeviceCopyStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = std::exchange(other.stream_, nullptr);
    event_ = std::exchange(other.event_, nullptr);
    device_ = other.device_;
  }
  return *this;
}

HostPinning::~HostPinning() { reset(); }
HostPinning::HostPinning(HostPinning&& other) noexcept : address_(std::exchange(other.address_, nullptr)) {}
HostPinning& HostPinning::operator=(HostPinning&& other) noexcept {
  if (this != &other) {
    reset();
    address_ = std::exchange(other.address_, nullptr);
  }
  return *this;
}

}  // namespace wb
