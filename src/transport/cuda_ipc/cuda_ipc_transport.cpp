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
#include "transport/region_table.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/traffic_counter.hpp"

namespace wb {
namespace {

constexpr std::uint64_t kKeyMagic = 0x57424b47;  // "WBKG"
constexpr std::uint64_t kKeyVersion = 1;
// The writes of a batch go out in one batched copy (cudaMemcpyBatchAsync where the runtime has it).
constexpr std::size_t kMaxWritesPerBatch = std::size_t{1} << 16;

using shm::hex;
using shm::within;

/// What a peer imports: the IPC handle of the allocation and where the region lies in it.
struct RemoteKey {
  int rank = -1;
  pid_t pid = 0;
  std::uint64_t pid_namespace = 0;
  int device = 0;
  cudaIpcMemHandle_t handle{};
  std::uint64_t offset = 0;   // of the region in its allocation
  std::uint64_t bytes = 0;
  std::uint64_t address = 0;  // in the owner's address space (used when the owner imports its own key)
};

std::vector<std::byte> encode_key(const RemoteKey& key) {
  codec::ByteWriter out;
  out.varint(kKeyMagic);
  out.varint(kKeyVersion);
  out.signed_varint(key.rank);
  out.varint(static_cast<std::uint64_t>(key.pid));
  out.varint(key.pid_namespace);
  out.signed_varint(key.device);
  out.bytes(std::as_bytes(std::span(key.handle.reserved)));
  out.varint(key.offset);
  out.varint(key.bytes);
  out.varint(key.address);
  std::vector<std::byte> bytes = out.take();
  shm::append_checksum(bytes);
  return bytes;
}

RemoteKey decode_key(int self, int peer, std::span<const std::byte> bytes) {
  const std::string what =
      "cuda_ipc memory key from rank " + std::to_string(peer) + " (imported on rank " + std::to_string(self) + ")";
  codec::ByteReader in(shm::checked_body(bytes, what), what);
  if (in.varint() != kKeyMagic) in.fail("not a cuda_ipc memory key");
  if (const std::uint64_t version = in.varint(); version != kKeyVersion)
    in.fail("version " + std::to_string(version) + ", this build reads " + std::to_string(kKeyVersion));
  RemoteKey key;
  key.rank = static_cast<int>(in.bounded_signed(0, INT_MAX, "rank"));
  key.pid = static_cast<pid_t>(in.bounded(INT_MAX, "pid"));
  key.pid_namespace = in.varint();
  key.device = static_cast<int>(in.bounded_signed(0, INT_MAX, "device"));
  const auto handle = in.bytes(sizeof key.handle.reserved);
  std::memcpy(key.handle.reserved, handle.data(), handle.size());
  key.offset = in.varint();
  key.bytes = in.varint();
  key.address = in.varint();
  in.expect_done();
  if (key.bytes == 0 || key.offset + key.bytes < key.offset || key.pid <= 0) in.fail("empty or wrapping region");
  if (key.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was registered by rank " + std::to_string(key.rank) +
                                                 ": keys were given to the wrong peer");
  return key;
}

class CudaIpcTransport final : public Transport {
 public:
  explicit CudaIpcTransport(int rank) : rank_(rank), mailbox_(check_device_and_get(rank, device_)) {}

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

  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.host_memory = false;
    caps.cuda_memory = true;
    caps.between_machines = false;
    caps.max_writes_per_batch = kMaxWritesPerBatch;
    return caps;
  }

  MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) override {
    if (memory != MemoryKind::kCuda)
      throw Error(ErrorCode::kUnsupported, "the cuda_ipc transport registers CUDA memory only; host memory goes "
                                           "through cma (rank " + std::to_string(rank_) + ")");
    if (address == nullptr || bytes == 0)
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc register_memory: empty region (" + std::to_string(bytes) +
                                                   " bytes at " + hex(reinterpret_cast<std::uint64_t>(address)) + ")");
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
    key.rank = rank_;
    key.pid = mailbox_.address().pid;
    key.pid_namespace = mailbox_.address().pid_namespace;
    key.device = device;
    WB_CHECK_CUDA(cudaIpcGetMemHandle(&key.handle, reinterpret_cast<void*>(base)));
    key.offset = offset;
    key.bytes = bytes;
    key.address = reinterpret_cast<std::uint64_t>(address);
    const std::uint32_t id = regions_.add_local(bytes);  // the same numbering as local_
    local_.push_back({static_cast<std::byte*>(address), bytes});
    return {id, encode_key(key)};
  }

  std::vector<std::byte> endpoint(int peer) override {
    return shm::encode_endpoint(TransportKind::kCudaIpc, peer, mailbox_.address());
  }

  void connect(int peer, std::span<const std::byte> peer_endpoint) override {
    if (peers_.contains(peer))
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc: rank " + std::to_string(rank_) +
                                                   " is already connected to rank " + std::to_string(peer));
    const shm::ProcessAddress theirs =
        shm::decode_endpoint(TransportKind::kCudaIpc, rank_, peer, peer_endpoint, mailbox_.address());
    auto ring = std::make_unique<shm::PeerRing>(rank_, peer, theirs);
    ring->verify();
    mailbox_.watch(peer);
    DeviceGuard guard(device_);
    Link link;
    link.pid = theirs.pid;
    link.ring = std::move(ring);
    // One event per batch that can be in flight: at most ring_slots are reserved and unwritten.
    link.events.resize(theirs.ring_slots, nullptr);
    link.pending.resize(theirs.ring_slots);
    try {
      WB_CHECK_CUDA(cudaStreamCreateWithFlags(&link.stream, cudaStreamNonBlocking));
      for (cudaEvent_t& event : link.events) WB_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    } catch (...) {
      for (cudaEvent_t event : link.events)
        if (event != nullptr) (void)cudaEventDestroy(event);
      if (link.stream != nullptr) (void)cudaStreamDestroy(link.stream);
      throw;
    }
    peers_.emplace(peer, std::move(link));
  }

  std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) override {
    const RemoteKey key = decode_key(rank_, peer, remote_key);
    if (auto it = peers_.find(peer); it != peers_.end() && it->second.pid != key.pid)
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc memory key from rank " + std::to_string(peer) + " names pid " +
                                                   std::to_string(key.pid) + ", but rank " + std::to_string(peer) +
                                                   " is pid " + std::to_string(it->second.pid));
    std::uint64_t address = 0;
    if (key.pid == mailbox_.address().pid) {
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
                                            std::to_string(key.device) + ") on rank " + std::to_string(rank_) + " (device " +
                                            std::to_string(device_) + ") failed: " + detail::cuda_error_string(rc));
        }
        it = opened_.emplace(handle, Opened{base}).first;
      }
      address = reinterpret_cast<std::uint64_t>(it->second.base) + key.offset;
    }
    const std::uint32_t id = regions_.add_remote(peer, key.bytes);  // the same numbering as remote_
    remote_.push_back({peer, key.pid, address, key.bytes});
    return id;
  }

  Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                     std::uint64_t token) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return Status(ErrorCode::kInvalidArgument, "cuda_ipc post_writes: rank " + std::to_string(peer) +
                                                     " is not connected to rank " + std::to_string(rank_));
    Link& link = it->second;
    if (writes.size() > kMaxWritesPerBatch)
      return Status(ErrorCode::kInvalidArgument, "cuda_ipc post_writes to rank " + std::to_string(peer) + ": " +
                                                     std::to_string(writes.size()) + " writes, at most " +
                                                     std::to_string(kMaxWritesPerBatch) + " a batch");
    WB_RETURN_IF_ERROR(regions_.check(peer, writes));  // every check before anything is enqueued
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
    return mailbox_.poll(completions);
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
        writes, [this](std::uint32_t id) { return reinterpret_cast<std::uint64_t>(local_[id].address); },
        [this](std::uint32_t id) { return remote_[id].address; }, copies_);
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

  struct Local {
    std::byte* address = nullptr;
    std::size_t bytes = 0;
  };
  struct Remote {
    int peer = -1;
    pid_t pid = 0;
    std::uint64_t address = 0;  // opened in this process
    std::uint64_t bytes = 0;
  };
  struct Pending {
    std::uint64_t token = 0;
    std::uint32_t immediate = 0;
    cudaEvent_t event = nullptr;
  };
  struct Link {
    pid_t pid = 0;
    std::unique_ptr<shm::PeerRing> ring;
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

  int rank_;
  int device_ = 0;
  shm::Mailbox mailbox_;
  std::vector<Local> local_;
  std::vector<Remote> remote_;
  RegionTable regions_{"cuda_ipc"};  // sizes and owners under the same ids: the batch check
  std::unordered_map<int, Link> peers_;
  std::map<std::string, Opened> opened_;  // IPC handle bytes -> base of the opened allocation
  cuda_ipc::CopyBatch copies_;            // scratch of enqueue, reused
  TrafficCounter traffic_;
};

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport(int rank) { return std::make_unique<CudaIpcTransport>(rank); }

}  // namespace wb
