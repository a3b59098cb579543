// A compiled copy program in the memory of one CUDA device (builds with CUDA only; defined in
// exec/cuda_copy_program.cpp): the descriptor array of exec/copy_work.hpp, uploaded once at connect, and
// one kernel launch per execution (exec/copy_kernel_launch.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "exec/copy_work.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

class DeviceCopyProgram {
 public:
  /// An empty program: execute launches nothing.
  DeviceCopyProgram() = default;
  /// Uploads `work` to `device` on `stream` (a cudaStream_t of that device, nullptr: the legacy default
  /// stream) and waits for the upload: a cudaMemcpy from pageable memory may return before its bytes
  /// land, and a kernel on a non-blocking stream would then read stale descriptors. Sizes the grid from
  /// the multiprocessors. Set-up: throws kCuda when the runtime fails, kUnsupported without a device.
  DeviceCopyProgram(CopyWork work, int device, void* stream = nullptr);
  ~DeviceCopyProgram();
  DeviceCopyProgram(DeviceCopyProgram&& other) noexcept;
  DeviceCopyProgram& operator=(DeviceCopyProgram&& other) noexcept;
  DeviceCopyProgram(const DeviceCopyProgram&) = delete;
  DeviceCopyProgram& operator=(const DeviceCopyProgram&) = delete;

  /// Launches the one kernel that performs every copy on `stream` (a cudaStream_t of the program's device,
  /// or nullptr) and returns without waiting; nothing for an empty program. Makes the device current for
  /// the launch and restores the caller's. kCuda when the launch fails (its own error).
  Status execute(void* stream) const noexcept;
  /// The same on another buffer of the compiled size (another pipeline slot): it must have the compiled
  /// buffer's alignment modulo 16 (kInvalidArgument otherwise).
  Status execute(void* stream, std::byte* buffer) const noexcept;

  const CopyWork& work() const { return work_; }
  const CopyWorkStats& stats() const { return work_.stats; }
  std::int64_t bytes() const { return work_.stats.bytes; }
  bool empty() const { return work_.items.empty(); }
  int device() const { return device_; }
  int blocks() const { return blocks_; }  // of the launch

 private:
  void release() noexcept;

  CopyWork work_;
  void* device_items_ = nullptr;
  int device_ = 0;
  int blocks_ = 0;
};

}  // namespace wb::exec
