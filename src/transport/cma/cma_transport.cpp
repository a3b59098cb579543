#include "transport/cma/cma_transport.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/byte_codec.hpp"
#include "core/checks.hpp"
#include "transport/region_table.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/traffic_counter.hpp"

namespace wb {
namespace {

constexpr std::uint64_t kKeyMagic = 0x57424b43;  // "WBKC"
constexpr std::uint64_t kKeyVersion = 1;
// process_vm_writev takes IOV_MAX segments a call; batches are cut into such calls, so this only bounds
// the scratch arrays.
constexpr std::size_t kMaxWritesPerBatch = std::size_t{1} << 20;

using shm::hex;

/// Registered memory of a peer: where it is in which process.
struct RemoteKey {
  int rank = -1;
  pid_t pid = 0;
  std::uint64_t pid_namespace = 0;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};

std::vector<std::byte> encode_key(const RemoteKey& key) {
  codec::ByteWriter out;
  out.varint(kKeyMagic);
  out.varint(kKeyVersion);
  out.signed_varint(key.rank);
  out.varint(static_cast<std::uint64_t>(key.pid));
  out.varint(key.pid_namespace);
  out.varint(key.address);
  out.varint(key.bytes);
  std::vector<std::byte> bytes = out.take();
  shm::append_checksum(bytes);
  return bytes;
}

RemoteKey decode_key(int self, int peer, std::span<const std::byte> bytes) {
  const std::string what = "cma memory key from rank " + std::to_string(peer) + " (imported on rank " + std::to_string(self) + ")";
  codec::ByteReader in(shm::checked_body(bytes, what), what);
  if (in.varint() != kKeyMagic) in.fail("not a cma memory key");
  if (const std::uint64_t version = in.varint(); version != kKeyVersion)
    in.fail("version " + std::to_string(version) + ", this build reads " + std::to_string(kKeyVersion));
  RemoteKey key;
  key.rank = static_cast<int>(in.bounded_signed(0, INT_MAX, "rank"));
  key.pid = static_cast<pid_t>(in.bounded(INT_MAX, "pid"));
  key.pid_namespace = in.varint();
  key.address = in.varint();
  key.bytes = in.varint();
  in.expect_done();
  if (key.address == 0 || key.bytes == 0 || key.address + key.bytes < key.address || key.pid <= 0)
    in.fail("empty or wrapping region [" + hex(key.address) + ", +" + std::to_string(key.bytes) + ")");
  if (key.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was registered by rank " + std::to_string(key.rank) +
                                                 ": keys were given to the wrong peer");
  return key;
}

class CmaTransport final : public Transport {
 public:
  explicit CmaTransport(int rank) : rank_(rank), mailbox_(rank) {}

  TransportKind kind() const override { return TransportKind::kCma; }

  TransportCapabilities capabilities() const override {
    TransportCapabilities caps;
    caps.host_memory = true;
    caps.cuda_memory = false;
    caps.between_machines = false;
    caps.max_writes_per_batch = kMaxWritesPerBatch;
    return caps;
  }

  MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) override {
    if (memory != MemoryKind::kHost)
      throw Error(ErrorCode::kUnsupported, "the cma transport registers host memory only; CUDA memory (device " +
                                               std::to_string(device) + ") goes through cuda_ipc (rank " +
                                               std::to_string(rank_) + ")");
    if (address == nullptr || bytes == 0)
      throw Error(ErrorCode::kInvalidArgument, "cma register_memory: empty region (" + std::to_string(bytes) + " bytes at " +
                                                   hex(reinterpret_cast<std::uint64_t>(address)) + ")");
    const std::uint32_t id = regions_.add_local(bytes);  // the same numbering as local_
    local_.push_back({static_cast<std::byte*>(address), bytes});
    RemoteKey key{rank_, mailbox_.address().pid, mailbox_.address().pid_namespace,
                  reinterpret_cast<std::uint64_t>(address), bytes};
    return {id, encode_key(key)};
  }

  std::vector<std::byte> endpoint(int peer) override {
    return shm::encode_endpoint(TransportKind::kCma, peer, mailbox_.address());
  }

  void connect(int peer, std::span<const std::byte> peer_endpoint) override {
    if (peers_.contains(peer))
      throw Error(ErrorCode::kInvalidArgument, "cma: rank " + std::to_string(rank_) + " is already connected to rank " +
                                                   std::to_string(peer));
    const shm::ProcessAddress theirs =
        shm::decode_endpoint(TransportKind::kCma, rank_, peer, peer_endpoint, mailbox_.address());
    for (const Remote& region : remote_)
      if (region.peer == peer && region.pid != theirs.pid)
        throw Error(ErrorCode::kInvalidArgument, "cma: memory imported from rank " + std::to_string(peer) + " belongs to pid " +
                                                     std::to_string(region.pid) + ", but rank " + std::to_string(peer) +
                                                     " is pid " + std::to_string(theirs.pid));
    auto ring = std::make_unique<shm::PeerRing>(rank_, peer, theirs);
    ring->verify();
    mailbox_.watch(peer);
    peers_.emplace(peer, Peer{theirs.pid, std::move(ring)});
  }

  std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) override {
    const RemoteKey key = decode_key(rank_, peer, remote_key);
    const std::uint64_t namespace_here = mailbox_.address().pid_namespace;
    if (key.pid_namespace != 0 && namespace_here != 0 && key.pid_namespace != namespace_here)
      throw Error(ErrorCode::kUnsupported, "cma memory key from rank " + std::to_string(peer) +
                                               " names a process in another PID namespace: the cma transport "
                                               "needs both ranks in one");
    if (auto it = peers_.find(peer); it != peers_.end() && it->second.pid != key.pid)
      throw Error(ErrorCode::kInvalidArgument, "cma memory key from rank " + std::to_string(peer) + " names pid " +
                                                   std::to_string(key.pid) + ", but rank " + std::to_string(peer) +
                                                   " is pid " + std::to_string(it->second.pid));
    const std::uint32_t id = regions_.add_remote(peer, key.bytes);  // the same numbering as remote_
    remote_.push_back({peer, key.pid, key.address, key.bytes});
    return id;
  }

  Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                     std::uint64_t token) override {
    auto it = peers_.find(peer);
    if (it == peers_.end())
      return Status(ErrorCode::kInvalidArgument,
                    "cma post_writes: rank " + std::to_string(peer) + " is not connected to rank " + std::to_string(rank_));
    Peer& target = it->second;
    if (writes.size() > kMaxWritesPerBatch)
      return Status(ErrorCode::kInvalidArgument, "cma post_writes to rank " + std::to_string(peer) + ": " +
                                                     std::to_string(writes.size()) + " writes, at most " +
                                                     std::to_string(kMaxWritesPerBatch) + " a batch");
    // Check every write before anything moves: an error posts nothing.
    WB_RETURN_IF_ERROR(regions_.check(peer, writes));
    local_iov_.clear();
    remote_iov_.clear();
    write_of_segment_.clear();
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const WriteRequest& w = writes[i];
      const Local& source = local_[w.local_memory];
      const Remote& target_region = remote_[w.remote_memory];
      if (w.bytes == 0) continue;
      local_iov_.push_back({source.address + w.local_offset, w.bytes});
      remote_iov_.push_back({reinterpret_cast<void*>(target_region.address + w.remote_offset), w.bytes});
      write_of_segment_.push_back(i);
    }
    WB_RETURN_IF_ERROR(target.ring->reserve());  // kRetryLater: nothing posted

    shm::VmFailure failure;
    if (!shm::vm_write(target.pid, local_iov_, remote_iov_, failure)) {
      target.ring->unreserve();
      const std::size_t i = write_of_segment_[failure.segment];
      const WriteRequest& w = writes[i];
      return Status(ErrorCode::kSystem,
                    "cma write " + std::to_string(i) + " to rank " + std::to_string(peer) + " (pid " +
                        std::to_string(target.pid) + ") failed at remote memory " + std::to_string(w.remote_memory) +
                        " offset " + std::to_string(w.remote_offset + failure.offset) + " (write of " +
                        std::to_string(w.bytes) + " bytes at offset " + std::to_string(w.remote_offset) +
                        "): process_vm_writev: " + shm::describe_vm_error(failure.error));
    }
    WB_RETURN_IF_ERROR(target.ring->notify(immediate));
    // process_vm_writev returned: the bytes are in the peer's memory and the source may be reused.
    done_.push_back({Completion::Kind::kWritesDone, peer, token, 0});
    traffic_.add(peer, batch_bytes(writes));
    return Status::ok();
  }

  Status poll(std::vector<Completion>& completions) override {
    completions.insert(completions.end(), done_.begin(), done_.end());
    done_.clear();
    return mailbox_.poll(completions);
  }

  std::vector<PeerTraffic> traffic() const override { return traffic_.snapshot(); }

 private:
  struct Local {
    std::byte* address = nullptr;
    std::size_t bytes = 0;
  };
  struct Remote {
    int peer = -1;
    pid_t pid = 0;
    std::uint64_t address = 0;
    std::uint64_t bytes = 0;
  };
  struct Peer {
    pid_t pid = 0;
    std::unique_ptr<shm::PeerRing> ring;
  };

  int rank_;
  shm::Mailbox mailbox_;
  std::vector<Local> local_;
  std::vector<Remote> remote_;
  RegionTable regions_{"cma"};  // sizes and owners under the same ids: the batch check
  std::unordered_map<int, Peer> peers_;
  std::vector<Completion> done_;  // writes done, reported by the next poll
  TrafficCounter traffic_;
  // Scratch of post_writes, kept to allocate nothing once warm.
  std::vector<iovec> local_iov_, remote_iov_;
  std::vector<std::size_t> write_of_segment_;
};

}  // namespace

std::unique_ptr<Transport> make_cma_transport(int rank) { return std::make_unique<CmaTransport>(rank); }

}  // namespace wb
