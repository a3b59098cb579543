// exec::DeviceCopyProgram (see device_copy_program.hpp). Builds with CUDA only.
#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/device.hpp"
#include "exec/copy_kernel_launch.hpp"
#include "exec/device_copy_program.hpp"

namespace wb::exec {

DeviceCopyProgram::DeviceCopyProgram(CopyWork work, int device, void* stream) : work_(std::move(work)), device_(device) {
  if (work_.items.empty()) return;  // nothing to launch: no device memory either
  if (cuda_device_count() == 0)
    throw Error(ErrorCode::kUnsupported, std::string("DeviceCopyProgram needs a CUDA device: ") + cuda_unavailable_reason());
  DeviceGuard guard(device);
  try {
    const std::size_t bytes = work_.items.size() * sizeof(CopyWorkItem);
    const auto s = static_cast<cudaStream_t>(stream);
    WB_CHECK_CUDA(cudaMalloc(&device_items_, bytes));
    WB_CHECK_CUDA(cudaMemcpyAsync(device_items_, work_.items.data(), bytes, cudaMemcpyHostToDevice, s));
    WB_CHECK_CUDA(cudaStreamSynchronize(s));
    blocks_ = copy_kernel_blocks(work_.items.size(), work_.has_transposes, device);
  } catch (...) {
    release();
    throw;
  }
}

DeviceCopyProgram::~DeviceCopyProgram() { release(); }

DeviceCopyProgram::DeviceCopyProgram(DeviceCopyProgram&& other) noexcept
    : work_(std::exchange(other.work_, CopyWork{})),
      device_items_(std::exchange(other.device_items_, nullptr)),
      device_(other.device_),
      blocks_(std::exchange(other.blocks_, 0)) {}

DeviceCopyProgram& DeviceCopyProgram::operator=(DeviceCopyProgram&& other) noexcept {
  if (this != &other) {
    release();
    work_ = std::exchange(other.work_, CopyWork{});
    device_items_ = std::exchange(other.device_items_, nullptr);
    device_ = other.device_;
    blocks_ = std::exchange(other.blocks_, 0);
  }
  return *this;
}

void DeviceCopyProgram::release() noexcept {
  if (device_items_ == nullptr) return;
  DeviceGuard guard;
  (void)guard.enter(device_);
  (void)cudaFree(device_items_);
  device_items_ = nullptr;
}

Status DeviceCopyProgram::execute(void* stream) const noexcept { return execute(stream, nullptr); }

Status DeviceCopyProgram::execute(void* stream, std::byte* buffer) const noexcept {
  if (work_.items.empty()) return Status::ok();
  WB_RETURN_IF_ERROR(check_buffer_alignment(work_, buffer));
  const std::uint64_t base = buffer == nullptr ? work_.buffer : reinterpret_cast<std::uint64_t>(buffer);
  const bool pack = work_.direction == CopyDirection::kPack;
  DeviceGuard guard;
  WB_RETURN_IF_ERROR(guard.enter(device_));
  const Status status = launch_copy_kernel(static_cast<const CopyWorkItem*>(device_items_),
                                           static_cast<std::uint32_t>(work_.items.size()), work_.has_transposes,
                                           pack ? 0 : base, pack ? base : 0, blocks_, stream);
  if (status) return status;
  return Status(status.code(), std::string(direction_name(work_.direction)) + " of " + std::to_string(work_.stats.bytes) +
                                   " bytes in " + std::to_string(work_.items.size()) + " items on cuda:" +
                                   std::to_string(device_) + ": " + status.message());
}

}  // namespace wb::exec
