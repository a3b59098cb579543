#include "transport/cuda_ipc/cuda_ipc_transport.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <map>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/byte_codec.hpp"
#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/log.hpp"
#include "transport/cuda_ipc/copy_batch.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/shm/memory_key.hpp"
#include "transport/shm/peer_links.hpp"
#include "transport/traffic_counter.hpp"

namespace wb {
namespace {

constexpr shm::KeyFormat kKeyFormat{0x57424b47, 1};  // "WBKG", version 1
// The writes of a batch go out in one batched copy (cudaMemcpyBatchAsync where the runtime has it).
constexpr std::size_t kMaxWritesPerBatch = std::size_t{1} << 16;

using shm::hex;
using shm::within;

/// What a peer imports: the IPC handle of the allocation and where the region lies in it.
struct RemoteKey {
  shm::KeyOwner owner;
  int device = 0;
  cudaIpcMemHandle_t handle{};
  std::uint64_t offset = 0;   // of the region in its allocation
  std::uint64_t bytes = 0;
  std::uint64_t address = 0;  // in the owner's address space (used when the owner imports its own key)
};

std::vector<std::byte> encode_key(const RemoteKey& key) {
  codec::ByteWriter out = shm::begin_key(kKeyFormat, key.owner);
  out.signed_varint(key.device);
  out.bytes(std::as_bytes(std::span(key.handle.reserved)));
  out.varint(key.offset);
  out.varint(key.bytes);
  out.varint(key.address);
  return shm::seal_key(out);
}

RemoteKey decode_key(int self, int peer, std::span<const std::byte> bytes) {
  shm::KeyReader reader(TransportKind::kCudaIpc, kKeyFormat, self, peer, bytes);
  codec::ByteReader& in = reader.in();
  RemoteKey key;
  key.owner = reader.owner();
  key.device = static_cast<int>(in.bounded_signed(0, INT_MAX, "device"));
  const auto handle = in.bytes(sizeof key.handle.reserved);
  std::memcpy(key.handle.reserved, handle.data(), handle.size());
  key.offset = in.varint();
  key.bytes = in.varint();
  key.address = in.varint();
  in.expect_done();
  if (key.bytes == 0 || key.offset + key.bytes < key.offset || key.owner.pid <= 0) in.fail("empty or wrapping region");
  reader.check_owner();
  return key;
}

class CudaIpcTransport final : public Transport {
 public:
  explicit CudaIpcTransport(int rank) : links_(TransportKind::kCudaIpc, check_device_and_get(rank, device_)) {}

  ~CudaIpcTransport() override {
    // Teardown: report nothing, release everything we can, on this transport's device (the caller's
    // current device may be another: handles opened on one device are closed on it).
    DeviceGuard guard;
    (void)guard.enter(device_);
    for (auto& [peer, link] : peers_) {
      (void)cudaStreamSynchronize(link.stream);
      for (cudaEvent_t event : link.events) (void)cudaEventDestroy(event);
      (void)cudaStreamDestroy(link.stream);
    }
    for (auto& [handle, opened] : opened_) (void)cudaIpcCloseMemHandle(opened.base);
  }

  TransportKind kind() const override { return TransportKind::kCudaIpc; }

  TransportCapabilities capabilities() const override { return links_.capabilities(kMaxWritesPerBatch); }

  MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) override {
    links_.check_registration(address, bytes, memory, device);
    const CudaPointerInfo info = query_cuda_pointer(address);
    if (info.kind != CudaPointerInfo::Kind::kDevice)
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc register_memory: " + hex(reinterpret_cast<std::uint64_t>(address)) +
                                                   " is " + cuda_pointer_kind_name(info.kind) +
                                                   ", not device memory from cudaMalloc; managed and host memory cannot be "
                                                   "shared with CUDA IPC");
    if (info.device != device)
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc register_memory: memory at " +
                                                   hex(reinterpret_cast<std::uint64_t>(address)) + " is on device " +
                                                   std::to_string(info.device) + ", not device " + std::to_string(device));
    const std::uint64_t base = info.allocation_base, allocation = info.allocation_bytes;
    const std::uint64_t offset = reinterpret_cast<std::uint64_t>(address) - base;
    if (!within(offset, bytes, allocation))
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc register_memory: " + std::to_string(bytes) + " bytes at " +
                                                   hex(reinterpret_cast<std::uint64_t>(address)) +
                                                   " run past the end of their allocation (" + std::to_string(allocation) +
                                                   " bytes at " + hex(base) + ")");
    RemoteKey key;
    key.owner = links_.owner();
    key.device = device;
    WB_CHECK_CUDA(cudaIpcGetMemHandle(&key.handle, reinterpret_cast<void*>(base)));
    key.offset = offset;
    key.bytes = bytes;
    key.address = reinterpret_cast<std::uint64_t>(address);
    const std::uint32_t id = links_.add_local(address, bytes);
    return {id, encode_key(key)};
  }

  std::vector<std::byte> endpoint(int peer) override { return links_.endpoint(peer); }

  void connect(int peer, std::span<const std::byte> peer_endpoint) override {
    shm::PeerLinks::Opened opened = links_.open(peer, peer_endpoint);
    DeviceGuard guard(device_);
    Link link;
    // One event per batch that can be in flight: at most ring_slots are reserved and unwritten.
    link.events.resize(opened.process.ring_slots, nullptr);
    link.pending.resize(opened.process.ring_slots);
    try {
      WB_CHECK_CUDA(cudaStreamCreateWithFlags(&link.stream, cudaStreamNonBlocking));
      for (cudaEvent_t& event : link.events) WB_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } catch (...) {
      for (cudaEvent_t event : link.events)
        if (event != nullptr) (void)cudaEventDestroy(event);
      if (link.stream != nullptr) (void)cudaStreamDestroy(link.stream);
      throw;
    }
    link.ring = &links_.add_peer(peer, std::move(opened));
    peers_.emplace(peer, std::move(link));
  }

  std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) override {
    const RemoteKey key = decode_key(links_.rank(), peer, remote_key);
    links_.check_key_owner(peer, key.owner.pid);
    std::uint64_t address = 0;
    if (key.owner.pid == links_.address().pid) {
      address = key.address;  // our own memory: CUDA IPC handles cannot be opened by their exporter
    } else {
      const std::string handle(key.handle.reserved, sizeof key.handle.reserved);
      auto it = opened_.find(handle);
      if (it == opened_.end()) {
        DeviceGuard guard(device_);
        void* base = nullptr;
        const cudaError_t rc = cudaIpcOpenMemHandle(&base, key.handle, cudaIpcMemLazyEnablePeerAccess);
        if (rc != cudaSuccess) {
          (void)cudaGetLastError();
          throw Error(ErrorCode::kCuda, "cudaIpcOpenMemHandle of memory of rank " + std::to_string(peer) + " (device " +
                                            std::to_string(key.device) + ") on rank " + std::to_string(links_.rank()) + " (device " +
                                            std::to_string(device_) + ") failed: " + detail::cuda_error_string(rc));
        }
        it = opened_.emplace(handle, Opened{base}).first;
      }
      address = reinterpret_cast<std::uint64_t>(it->second.base) + key.offset;
    }
    return links_.add_remote(peer, key.owner.pid, address, key.bytes);
  }

  Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                     std::uint64_t token) override {
    WB_RETURN_IF_ERROR(links_.check_batch(peer, writes, kMaxWritesPerBatch));  // every check before anything is enqueued
    Link& link = peers_.at(peer);
    // The copies go on this transport's device (a no-op unless the caller switched devices).
    DeviceGuard guard;
    WB_RETURN_IF_ERROR(guard.enter(device_));
    return enqueue(peer, link, writes, immediate, token);
  }

  Status poll(std::vector<Completion>& completions) override {
    for (auto& [peer, link] : peers_) {
      while (link.count > 0) {
        const Pending& batch = link.pending[link.first];
        const cudaError_t rc = cudaEventQuery(batch.event);
        if (rc == cudaErrorNotReady) break;
        if (rc != cudaSuccess)
          return Status(ErrorCode::kCuda, "cuda_ipc batch to rank " + std::to_string(peer) + " (token " +
                                              std::to_string(batch.token) + ") failed: cudaEventQuery: " + detail::cuda_error_string(rc));
        // The copies are complete: only now may the receiver hear of them.
        WB_RETURN_IF_ERROR(link.ring->notify(batch.immediate));
        completions.push_back({Completion::Kind::kWritesDone, peer, batch.token, 0});
        link.first = (link.first + 1) % link.pending.size();
        --link.count;
      }
    }
    return links_.mailbox().poll(completions);
  }

  std::vector<PeerTraffic> traffic() const override { return traffic_.snapshot(); }

 private:
  struct Link;

  /// post_writes once the batch is checked and the right device is current.
  Status enqueue(int peer, Link& link, std::span<const WriteRequest> writes, std::uint32_t immediate, std::uint64_t token) {
    WB_RETURN_IF_ERROR(link.ring->reserve());  // kRetryLater: nothing posted
    const std::size_t slot = (link.first + link.count) % link.pending.size();
    cudaEvent_t event = link.events[link.posted % link.events.size()];
    copies_.clear();
    cuda_ipc::collect_copies(
        writes, [this](std::uint32_t id) { return reinterpret_cast<std::uint64_t>(links_.local_address(id)); },
        [this](std::uint32_t id) { return links_.remote_address(id); }, copies_);
    if (const cudaError_t rc = copy(copies_, link.stream); rc != cudaSuccess) {
      (void)cudaGetLastError();
      link.ring->unreserve();
      return Status(ErrorCode::kCuda, "cuda_ipc batch to rank " + std::to_string(peer) + " (" + std::to_string(copies_.size()) +
                                          " copies, " + std::to_string(copies_.bytes) + " bytes): the copy failed: " +
                                          detail::cuda_error_string(rc) + " (some copies of the batch may have been enqueued)");
    }
    if (const cudaError_t rc = cudaEventRecord(event, link.stream); rc != cudaSuccess) {
      link.ring->unreserve();
      return Status(ErrorCode::kCuda, "cuda_ipc batch to rank " + std::to_string(peer) +
                                          ": cudaEventRecord failed: " + detail::cuda_error_string(rc) +
                                          " (its writes were enqueued; no arrival will be notified)");
    }
    link.pending[slot] = {token, immediate, event};
    ++link.count;
    ++link.posted;
    traffic_.add(peer, batch_bytes(writes));
    return Status::ok();
  }

  /// Enqueues `batch` on `stream`: one batched call where the runtime has cudaMemcpyBatchAsync (CUDA 13),
  /// else a cudaMemcpyAsync per copy.
  static cudaError_t copy(const cuda_ipc::CopyBatch& batch, cudaStream_t stream) {
    if (batch.size() == 0) return cudaSuccess;
    if (batch.size() == 1) return cudaMemcpyAsync(batch.dst[0], batch.src[0], batch.sizes[0], cudaMemcpyDefault, stream);
#if CUDART_VERSION >= 13000
    cudaMemcpyAttributes attributes{};
    attributes.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    std::size_t first = 0;  // every copy takes attributes[0]
    return cudaMemcpyBatchAsync(batch.dst.data(), batch.src.data(), batch.sizes.data(), batch.size(), &attributes, &first, 1,
                                stream);
#else
    for (std::size_t i = 0; i < batch.size(); ++i)
      if (const cudaError_t rc = cudaMemcpyAsync(batch.dst[i], batch.src[i], batch.sizes[i], cudaMemcpyDefault, stream);
          rc != cudaSuccess)
        return rc;
    return cudaSuccess;
#endif
  }

  struct Pending {
    std::uint64_t token = 0;
    std::uint32_t immediate = 0;
    cudaEvent_t event = nullptr;
  };
  struct Link {
    shm::PeerRing* ring = nullptr;  // owned by links_
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;
    std::vector<Pending> pending;  // a FIFO of batches whose notification is not yet written
    std::size_t first = 0, count = 0;
    std::uint64_t posted = 0;
  };
  struct Opened {
    void* base = nullptr;
  };

  /// Fails cleanly without a device (the error code, not the count, says why), then picks the current one.
  static int check_device_and_get(int rank, int& device) {
    int count = 0;
    const cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();
      throw Error(ErrorCode::kUnsupported, "the cuda_ipc transport needs a CUDA device: cudaGetDeviceCount failed: " +
                                               detail::cuda_error_string(rc));
    }
    if (count <= 0)
      throw Error(ErrorCode::kUnsupported, "the cuda_ipc transport needs a CUDA device: none is visible to this process");
    WB_CHECK_CUDA(cudaGetDevice(&device));
    return rank;
  }

  int device_ = 0;                  // set before links_ is made (check_device_and_get)
  shm::PeerLinks links_;            // mailbox, registrations, imports and connected processes
  std::unordered_map<int, Link> peers_;  // the device side of each connected peer
  std::map<std::string, Opened> opened_;  // IPC handle bytes -> base of the opened allocation
  cuda_ipc::CopyBatch copies_;            // scratch of enqueue, reused
  TrafficCounter traffic_;
};

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport(int rank) { return std::make_unique<CudaIpcTransport>(rank); }

}  // namespace wb
