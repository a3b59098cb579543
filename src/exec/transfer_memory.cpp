// Transfer-buffer memory (see transfer_memory.hpp): host mappings, the choice of memory, the allocation of
// both buffers. Device and pinned memory: exec/cuda_transfer_memory.cpp.
#include "exec/transfer_memory.hpp"

#include <algorithm>
#include <functional>
#include <string>

#include "exec/host_mapping.hpp"
#include "exec/round_executor.hpp"
#include "weightbridge/status.hpp"

namespace wb {

MemoryKind choose_buffer_memory(MemoryKind parameters,
                                std::span<const std::pair<TransportKind, TransportCapabilities>> transports) {
  if (parameters == MemoryKind::kHost) return MemoryKind::kHost;
  bool device = true, host = true;
  std::string names;
  for (const auto& [kind, capabilities] : transports) {
    device = device && capabilities.cuda_memory;
    host = host && capabilities.host_memory;
    names += std::string(names.empty() ? "" : ", ") + transport_name(kind) + " (registers " +
             (capabilities.cuda_memory && capabilities.host_memory ? "CUDA and host"
              : capabilities.cuda_memory                           ? "CUDA"
              : capabilities.host_memory                           ? "host"
                                                                   : "no") +
             " memory)";
  }
  if (device) return MemoryKind::kCuda;
  if (host) return MemoryKind::kHost;
  throw Error(ErrorCode::kUnsupported, "no memory for the transfer buffers of CUDA parameters that every transport of "
                                       "this rank can register: " + names +
                                       "; choose one transport for all pairs (WB_TRANSPORT)");
}

namespace exec {
namespace {

// An empty buffer still gets a registration, so that every peer has a key.
std::byte no_buffer{};

class HostBuffer final : public BufferMemory {
 public:
  explicit HostBuffer(std::size_t bytes) : mapping_(bytes) {
    data_ = for_copies_ = mapping_.empty() ? &no_buffer : mapping_.data();
    size_ = std::max<std::size_t>(1, mapping_.size());
  }

 private:
  HostMapping mapping_;
};

}  // namespace

std::unique_ptr<BufferMemory> allocate_host_buffer(std::size_t bytes) { return std::make_unique<HostBuffer>(bytes); }

TransferBuffers allocate_transfer_buffers(MemoryKind parameters, MemoryKind buffers, int device, int depth,
                                          std::int64_t send_slot_bytes, std::int64_t receive_slot_bytes,
                                          const TransferBuffers* kept) {
  TransferBuffers t;
  t.memory = buffers;
  t.device = buffers == MemoryKind::kCuda ? device : 0;
  t.parameters = parameters;
  t.parameter_device = parameters == MemoryKind::kCuda ? device : 0;
  // Host memory of the same kind (plain for host parameters, pinned for this device's) serves again.
  const bool reusable = kept != nullptr && buffers == MemoryKind::kHost && kept->memory == MemoryKind::kHost &&
                        kept->parameters == parameters && kept->parameter_device == t.parameter_device;
  const auto take = [&](const std::shared_ptr<BufferMemory>& old, std::size_t bytes,
                        const std::function<std::unique_ptr<BufferMemory>(std::size_t)>& allocate) -> std::shared_ptr<BufferMemory> {
    if (reusable && old && old->size() >= std::max<std::size_t>(1, bytes)) return old;
    return allocate(bytes);
  };
  if (parameters == MemoryKind::kHost) {
    t.send_slot_stride = send_slot_bytes;
    t.receive_slot_stride = receive_slot_bytes;
    t.send = take(kept ? kept->send : nullptr, static_cast<std::size_t>(depth * t.send_slot_stride), allocate_host_buffer);
    t.receive = take(kept ? kept->receive : nullptr, static_cast<std::size_t>(depth * t.receive_slot_stride), allocate_host_buffer);
    return t;
  }
  const auto aligned = [](std::int64_t bytes) {
    return (bytes + kDeviceSlotAlignment - 1) / kDeviceSlotAlignment * kDeviceSlotAlignment;
  };
  t.send_slot_stride = aligned(send_slot_bytes);
  t.receive_slot_stride = aligned(receive_slot_bytes);
  const auto send_bytes = static_cast<std::size_t>(std::max(kDeviceSlotAlignment, depth * t.send_slot_stride));
  const auto receive_bytes = static_cast<std::size_t>(std::max(kDeviceSlotAlignment, depth * t.receive_slot_stride));
  if (buffers == MemoryKind::kCuda) {
    t.send = allocate_device_buffer(send_bytes, device);
    t.receive = allocate_device_buffer(receive_bytes, device);
  } else {
    const auto pinned = [device](std::size_t bytes) { return allocate_pinned_buffer(bytes, device); };
    t.send = take(kept ? kept->send : nullptr, send_bytes, pinned);
    t.receive = take(kept ? kept->receive : nullptr, receive_bytes, pinned);
  }
  return t;
}

}  // namespace exec
}  // namespace wb
