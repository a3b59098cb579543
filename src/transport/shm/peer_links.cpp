#include "transport/shm/peer_links.hpp"

#include <string>
#include <utility>

namespace wb::shm {

PeerLinks::PeerLinks(TransportKind kind, int rank)
    : kind_(kind), name_(transport_name(kind)), rank_(rank), mailbox_(rank), regions_(name_) {}

TransportCapabilities PeerLinks::capabilities(std::size_t max_writes) const {
  TransportCapabilities caps;
  caps.host_memory = kind_ == TransportKind::kCma;
  caps.cuda_memory = kind_ == TransportKind::kCudaIpc;
  caps.between_machines = false;
  caps.max_writes_per_batch = max_writes;
  return caps;
}

void PeerLinks::check_registration(const void* address, std::size_t bytes, MemoryKind memory, int device) const {
  if (kind_ == TransportKind::kCma && memory != MemoryKind::kHost)
    throw Error(ErrorCode::kUnsupported, "the cma transport registers host memory only; CUDA memory (device " +
                                             std::to_string(device) + ") goes through cuda_ipc (rank " +
                                             std::to_string(rank_) + ")");
  if (kind_ == TransportKind::kCudaIpc && memory != MemoryKind::kCuda)
    throw Error(ErrorCode::kUnsupported, "the cuda_ipc transport registers CUDA memory only; host memory goes "
                                         "through cma (rank " + std::to_string(rank_) + ")");
  if (address == nullptr || bytes == 0)
    throw Error(ErrorCode::kInvalidArgument, std::string(name_) + " register_memory: empty region (" +
                                                 std::to_string(bytes) + " bytes at " +
                                                 hex(reinterpret_cast<std::uint64_t>(address)) + ")");
}

std::uint32_t PeerLinks::add_local(void* address, std::size_t bytes) {
  const std::uint32_t id = regions_.add_local(bytes);  // the same numbering as local_
  local_.push_back({static_cast<std::byte*>(address), bytes});
  return id;
}

std::uint32_t PeerLinks::add_remote(int peer, pid_t pid, std::uint64_t address, std::uint64_t bytes) {
  const std::uint32_t id = regions_.add_remote(peer, bytes);  // the same numbering as remote_
  remote_.push_back({peer, pid, address, bytes});
  return id;
}

std::vector<std::byte> PeerLinks::endpoint(int peer) const { return encode_endpoint(kind_, peer, mailbox_.address()); }

PeerLinks::Opened PeerLinks::open(int peer, std::span<const std::byte> record) {
  if (peers_.contains(peer))
    throw Error(ErrorCode::kInvalidArgument, std::string(name_) + ": rank " + std::to_string(rank_) +
                                                 " is already connected to rank " + std::to_string(peer));
  ProcessAddress theirs = decode_endpoint(kind_, rank_, peer, record, mailbox_.address());
  for (const Remote& region : remote_)
    if (region.peer == peer && region.pid != theirs.pid)
      throw Error(ErrorCode::kInvalidArgument, std::string(name_) + ": memory imported from rank " + std::to_string(peer) +
                                                   " belongs to pid " + std::to_string(region.pid) + ", but rank " +
                                                   std::to_string(peer) + " is pid " + std::to_string(theirs.pid));
  auto ring = std::make_unique<PeerRing>(rank_, peer, theirs);
  ring->verify();
  mailbox_.watch(peer);
  return {std::move(theirs), std::move(ring)};
}

PeerRing& PeerLinks::add_peer(int peer, Opened opened) {
  return *peers_.emplace(peer, std::move(opened)).first->second.ring;
}

void PeerLinks::check_key_owner(int peer, pid_t pid) const {
  if (auto it = peers_.find(peer); it != peers_.end() && it->second.process.pid != pid)
    throw Error(ErrorCode::kInvalidArgument, std::string(name_) + " memory key from rank " + std::to_string(peer) +
                                                 " names pid " + std::to_string(pid) + ", but rank " +
                                                 std::to_string(peer) + " is pid " + std::to_string(it->second.process.pid));
}

Status PeerLinks::check_batch(int peer, std::span<const WriteRequest> writes, std::size_t max_writes) const {
  if (!peers_.contains(peer))
    return Status(ErrorCode::kInvalidArgument, std::string(name_) + " post_writes: rank " + std::to_string(peer) +
                                                   " is not connected to rank " + std::to_string(rank_));
  if (writes.size() > max_writes)
    return Status(ErrorCode::kInvalidArgument, std::string(name_) + " post_writes to rank " + std::to_string(peer) + ": " +
                                                   std::to_string(writes.size()) + " writes, at most " +
                                                   std::to_string(max_writes) + " a batch");
  return regions_.check(peer, writes);  // every write, before anything moves: an error posts nothing
}

}  // namespace wb::shm
