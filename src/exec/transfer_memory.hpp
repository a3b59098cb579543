// The round executor's transfer buffers: `depth` slots of a send buffer and of a receive buffer, allocated
// once at connect and registered with every transport the rank uses. Where they go:
//   host parameters                    host memory, a mapping of its own (exec/transfer_memory.cpp)
//   CUDA parameters, every transport   device memory (exec/cuda_transfer_memory.cpp)
//     registers CUDA memory
//   CUDA parameters, otherwise         the same host mapping, registered with CUDA (cudaHostRegister,
//                                      mapped into the device: the kernels reach it)
// (choose_buffer_memory, round_executor.hpp).
//
// Host mappings are never simply freed: a peer that has not yet noticed that this side failed or ended
// may still write into them (cma writes any mapped address of the process), and must then fail with
// EFAULT instead of landing in memory the process has handed out again. So at release the range is
// replaced by one without access. Device memory another process has open through CUDA IPC must not be
// freed before that process closed it: the executor's teardown is collective, and device memory whose
// peers did not confirm is abandoned (left allocated) rather than freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/transport.hpp"

namespace wb::exec {

/// One allocation of a transfer buffer.
class BufferMemory {
 public:
  virtual ~BufferMemory() = default;
  /// What the transports register (never null: an empty buffer is one byte, so every peer gets a key).
  std::byte* data() const { return data_; }
  /// What pack and assemble address: the same, or the device's mapping of pinned host memory.
  std::byte* for_copies() const { return for_copies_; }
  /// Bytes registered.
  std::size_t size() const { return size_; }
  /// Teardown when a peer may still have the memory open: keep it rather than free it.
  virtual void abandon() noexcept {}

 protected:
  std::byte* data_ = nullptr;
  std::byte* for_copies_ = nullptr;
  std::size_t size_ = 0;
};

/// Zeroed host memory of `bytes` in a mapping of its own, populated (a first touch inside an update would
/// be a page fault per 4 KiB on the update path). Set-up: throws wb::Error (kSystem).
std::unique_ptr<BufferMemory> allocate_host_buffer(std::size_t bytes);
/// The same mapping, registered with CUDA and mapped into `device`.
std::unique_ptr<BufferMemory> allocate_pinned_buffer(std::size_t bytes, int device);
/// Zeroed device memory of `device`; the zeroing is complete when this returns (before any transport
/// registers or exports the memory).
std::unique_ptr<BufferMemory> allocate_device_buffer(std::size_t bytes, int device);

/// Slot size and alignment of transfer buffers the kernels address: slots 256-byte aligned, so that one
/// compiled program serves every slot.
inline constexpr std::int64_t kDeviceSlotAlignment = 256;

struct TransferBuffers {
  MemoryKind memory = MemoryKind::kHost;  // as registered
  int device = 0;                         // memory == kCuda
  std::int64_t send_slot_stride = 0, receive_slot_stride = 0;  // bytes from one slot to the next
  MemoryKind parameters = MemoryKind::kHost;  // the parameters they serve (CUDA: host buffers are pinned
  int parameter_device = 0;                   // for and mapped into this device)
  // Shared: a later executor of the same rank may take them over (ExecutorOptions::reuse_buffers).
  std::shared_ptr<BufferMemory> send, receive;
};

/// Allocates both buffers: `depth` slots of `send_slot_bytes` and `receive_slot_bytes`, for parameters in
/// `parameters` memory on `device`, in `buffers` memory (choose_buffer_memory). Set-up: throws wb::Error.
/// `kept`: an earlier executor's buffers of this rank, whose updates have all ended; each that is host
/// memory (plain or pinned for the same device) and large enough is used again instead of a new one
/// (populating a new mapping costs its size in page zeroing: 150-230 ms a rank at a join of 208 MB with 8
/// ranks on 2 cores, measured). Device memory is never taken over (a peer would open its CUDA IPC handle
/// a second time).
TransferBuffers allocate_transfer_buffers(MemoryKind parameters, MemoryKind buffers, int device, int depth,
                                          std::int64_t send_slot_bytes, std::int64_t receive_slot_bytes,
                                          const TransferBuffers* kept = nullptr);

}  // namespace wb::exec
