#include "transport/cuda_ipc/cuda_ipc_transport.hpp"

#include <cuda.h>  // CUresult and CUdeviceptr only: the driver is reached through cudaGetDriverEntryPoint*
#include <cudaTypedefs.h>
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
#include "transport/shm/mailbox.hpp"
#include "transport/region_table.hpp"
#include "transport/traffic_counter.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/log.hpp"

namespace wb {
namespace {

constexpr std::uint64_t kKeyMagic = 0x57424b47;  // "WBKG"
constexpr std::uint64_t kKeyVersion = 1;
// Every write is one cudaMemcpyAsync; the executor sends few large writes per batch.
constexpr std::size_t kMaxWritesPerBatch = std::size_t{1} << 16;

using shm::hex;
using shm::within;

std::string cuda_error_text(cudaError_t rc) {
  return std::string(cudaGetErrorName(rc)) + ": " + cudaGetErrorString(rc);
}

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
    throw Error(ErrorCode::kCuda, "cuMemGetAddressRange(" + hex(reinterpret_cast<std::uint64_t>(address)) +
                                      ") failed: CUresult " + std::to_string(static_cast<int>(rc)));
  base = static_cast<std::uint64_t>(start);
  size = bytes;
}

/// Makes `device` current until the end of the scope (set-up: throws).
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    WB_CHECK_CUDA(cudaGetDevice(&previous_));
    if (previous_ != device) WB_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceScope() {
    int current = previous_;
    if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

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
    // Teardown: report nothing, release everything we can.
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
    cudaPointerAttributes attributes{};
    WB_CHECK_CUDA(cudaPointerGetAttributes(&attributes, address));
    if (attributes.type != cudaMemoryTypeDevice)
      throw Error(ErrorCode::kInvalidArgument,
                  "cuda_ipc register_memory: " + hex(reinterpret_cast<std::uint64_t>(address)) +
                      " is not device memory from cudaMalloc (cudaMemoryType " + std::to_string(static_cast<int>(attributes.type)) +
                      "); managed and host memory cannot be shared with CUDA IPC");
    if (attributes.device != device)
      throw Error(ErrorCode::kInvalidArgument, "cuda_ipc register_memory: memory at " +
                                                   hex(reinterpret_cast<std::uint64_t>(address)) + " is on device " +
                                                   std::to_string(attributes.device) + ", not device " + std::to_string(device));
    std::uint64_t base = 0, allocation = 0;
    allocation_range(address, base, allocation);
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
    DeviceScope scope(device_);
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
        DeviceScope scope(device_);
        void* base = nullptr;
        const cudaError_t rc = cudaIpcOpenMemHandle(&base, key.handle, cudaIpcMemLazyEnablePeerAccess);
        if (rc != cudaSuccess) {
          (void)cudaGetLastError();
          throw Error(ErrorCode::kCuda, "cudaIpcOpenMemHandle of memory of rank " + std::to_string(peer) + " (device " +
                                            std::to_string(key.device) + ") on rank " + std::to_string(rank_) + " (device " +
                                            std::to_string(device_) + ") failed: " + cuda_error_text(rc));
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
    int current = device_;
    WB_TRY_CUDA(cudaGetDevice(&current));
    if (current != device_) WB_TRY_CUDA(cudaSetDevice(device_));
    Status status = enqueue(peer, link, writes, immediate, token);
    if (current != device_) (void)cudaSetDevice(current);
    return status;
  }

  Status poll(std::vector<Completion>& completions) override {
    for (auto& [peer, link] : peers_) {
      while (link.count > 0) {
        const Pending& batch = link.pending[link.first];
        const cudaError_t rc = cudaEventQuery(batch.event);
        if (rc == cudaErrorNotReady) break;
        if (rc != cudaSuccess)
          return Status(ErrorCode::kCuda, "cuda_ipc batch to rank " + std::to_string(peer) + " (token " +
                                              std::to_string(batch.token) + ") failed: cudaEventQuery: " + cuda_error_text(rc));
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
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const WriteRequest& w = writes[i];
      if (w.bytes == 0) continue;
      const cudaError_t rc = cudaMemcpyAsync(reinterpret_cast<void*>(remote_[w.remote_memory].address + w.remote_offset),
                                             local_[w.local_memory].address + w.local_offset, w.bytes,
                                             cudaMemcpyDefault, link.stream);
      if (rc != cudaSuccess) {
        link.ring->unreserve();
        return Status(ErrorCode::kCuda, "cuda_ipc write " + std::to_string(i) + " to rank " + std::to_string(peer) +
                                            " (remote memory " + std::to_string(w.remote_memory) + " offset " +
                                            std::to_string(w.remote_offset) + ", " + std::to_string(w.bytes) +
                                            " bytes): cudaMemcpyAsync failed: " + cuda_error_text(rc) +
                                            " (earlier writes of the batch may have been enqueued)");
      }
    }
    if (const cudaError_t rc = cudaEventRecord(event, link.stream); rc != cudaSuccess) {
      link.ring->unreserve();
      return Status(ErrorCode::kCuda, "cuda_ipc batch to rank " + std::to_string(peer) +
                                          ": cudaEventRecord failed: " + cuda_error_text(rc) +
                                          " (its writes were enqueued; no arrival will be notified)");
    }
    link.pending[slot] = {token, immediate, event};
    ++link.count;
    ++link.posted;
    traffic_.add(peer, batch_bytes(writes));
    return Status::ok();
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
                                               cuda_error_text(rc));
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
  TrafficCounter traffic_;
};

}  // namespace

std::unique_ptr<Transport> make_cuda_ipc_transport(int rank) { return std::make_unique<CudaIpcTransport>(rank); }

}  // namespace wb
